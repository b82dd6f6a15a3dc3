from django.urls import path

from history import views

app_name = "history"

urlpatterns = [
    path("", views.recent, name="recent"),
    path("pools/", views.pools, name="pools"),
    path("request/<str:request_id>/", views.detail, name="detail"),
]
