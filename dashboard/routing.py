"""Websocket routes, served by daphne through dispatch_project.asgi."""

from django.urls import path

from dashboard.consumers import FabricConsumer

websocket_urlpatterns = [
    path("ws/fabric/<str:group_id>/", FabricConsumer.as_asgi()),
]
