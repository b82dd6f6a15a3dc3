from django.contrib.staticfiles.urls import staticfiles_urlpatterns
from django.urls import path

from dashboard import views

app_name = "dashboard"

urlpatterns = [
    path("", views.index, name="index"),
    path("fabric/<str:group_id>/", views.fabric, name="fabric"),
    path("fabric/<str:group_id>/pools/<str:pool_id>/pause/", views.pool_pause, name="pool_pause"),
    path("fabric/<str:group_id>/pools/<str:pool_id>/resume/", views.pool_resume, name="pool_resume"),
    path("metrics", views.prometheus, name="metrics"),
]

# Plain `daphne` serves no static files; with DEBUG on, Django serves them (dashboard JS, admin CSS).
# Production: collectstatic behind the web server, or wrap the ASGI app in ASGIStaticFilesHandler.
urlpatterns += staticfiles_urlpatterns()
