"""Rendered Kustomize overlays, once per session (each render is a kubectl process)."""

from __future__ import annotations

import pytest

from .manifests import K8S_DIR, OVERLAYS, Manifest, render


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[Manifest]]:
    """overlay name ('base' too) -> the objects `kubectl kustomize` renders for it."""
    renders = {"base": render(K8S_DIR / "base")}
    for overlay in OVERLAYS:
        renders[overlay] = render(K8S_DIR / "overlays" / overlay)
    return renders
