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
