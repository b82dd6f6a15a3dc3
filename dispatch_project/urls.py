from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("history/", include("history.urls")),
    path("", include("dashboard.urls")),
]
