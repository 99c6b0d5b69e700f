"""The lab's gateway (issue 41) for cluster tests: specgate_lab.gateway (Traefik, the Gateway API CRDs,
the pod range routed to lo; its docstring says why), re-exported where the tests have always
imported it from, and what only tests read: the route's status and plain GETs.

Needs `make gateway` (Traefik and the CRDs into the cache)."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any, cast

from kubernetes import client

from specgate_lab.gateway import CLASS_LABEL as CLASS_LABEL
from specgate_lab.gateway import CONTROLLER as CONTROLLER
from specgate_lab.gateway import GATEWAY as GATEWAY
from specgate_lab.gateway import GROUP as GROUP
from specgate_lab.gateway import LISTENER as LISTENER
from specgate_lab.gateway import VERSION as VERSION
from specgate_lab.gateway import condition as condition
from specgate_lab.gateway import gateway_class as gateway_class
from specgate_lab.gateway import gateway_lab as gateway_lab
from specgate_lab.gateway import install_gateway_api_crds as install_gateway_api_crds
from specgate_lab.gateway import lab_gateway as lab_gateway
from specgate_lab.gateway import pod_cidr as pod_cidr
from specgate_lab.gateway import route_pod_range as route_pod_range
from specgate_lab.gateway import traefik as traefik


def route_parent(api_client: client.ApiClient, namespace: str, route: str) -> dict[str, Any] | None:
    """Traefik's entry in the HTTPRoute's status.parents, once it wrote one."""
    found = cast(
        dict[str, Any],
        client.CustomObjectsApi(api_client).get_namespaced_custom_object(
            GROUP, VERSION, namespace, "httproutes", route
        ),
    )
    parents: list[dict[str, Any]] = found.get("status", {}).get("parents", [])
    return next((p for p in parents if p.get("controllerName") == CONTROLLER), None)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
