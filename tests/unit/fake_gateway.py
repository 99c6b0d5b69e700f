"""HTTPRoutes as the API server stores them and a Gateway serves them, for the day-2 fuzz
(day2_history.py), modelled on what the Gateway API spec and the lab's Traefik do:
- an apply that changes the spec bumps metadata.generation and resourceVersion; the status stays
  the Gateway's report on the generation it last accepted until it accepts the new one;
- the Gateway accepts the route's current generation some ticks later (each tick with chance
  `accept_rate`), and only then serves its rules: until then the data plane sends traffic by the
  weights it last accepted (a status a tick behind its data plane is not modelled: a track's last
  pods wait scaleDownDelay after the status, which the fuzz's 10 s ticks do not resolve);
- a JSON patch (RFC 6902: test, add, replace, remove) as `kubectl patch --type json` sends it, a
  failed test refused as the API server refuses it (kube.Conflict).
"""

from __future__ import annotations

import copy
import random
from typing import Any

from specgate import kube


class FakeGateway:
    def __init__(self, rng: random.Random, accept_rate: float = 0.7) -> None:
        self.rng = rng
        self.accept_rate = accept_rate
        self.routes: dict[str, dict[str, Any]] = {}
        self.served: dict[str, dict[str, Any]] = {}  # the spec the Gateway serves, by route name
        self._versions = 0

    def apply(self, manifest: dict[str, Any]) -> None:
        name = manifest["metadata"]["name"]
        route = self.routes.get(name)
        if route is not None and route["spec"] == manifest["spec"]:
            return
        generation = route["metadata"]["generation"] + 1 if route is not None else 1
        self._store(name, manifest, generation, route.get("status", {}) if route is not None else {})

    def read(self, name: str) -> dict[str, Any] | None:
        route = self.routes.get(name)
        return copy.deepcopy(route) if route is not None else None

    def patch(self, name: str, operations: list[dict[str, Any]]) -> None:
        route = self.routes.get(name)
        if route is None:
            raise kube.Conflict(f"HTTPRoute {name} not found")
        patched = copy.deepcopy(route)
        for operation in operations:
            _apply_operation(patched, operation, name)
        generation = route["metadata"]["generation"] + (patched["spec"] != route["spec"])
        self._store(name, patched, generation, route.get("status", {}))

    def delete(self, name: str) -> None:
        self.routes.pop(name, None)
        self.served.pop(name, None)

    def tick(self) -> None:
        """The Gateway's controller: accepts each route's current generation with chance
        accept_rate, and serves it."""
        for name, route in self.routes.items():
            if self.rng.random() >= self.accept_rate:
                continue
            generation = route["metadata"]["generation"]
            conditions = [
                {"type": kind, "status": "True", "reason": kind, "observedGeneration": generation}
                for kind in ("Accepted", "ResolvedRefs")
            ]
            parents = [
                {"parentRef": ref, "conditions": conditions} for ref in route["spec"].get("parentRefs", [])
            ]
            route["status"] = {"parents": parents}
            self.served[name] = copy.deepcopy(route["spec"])

    def served_backends(self, name: str) -> dict[str, int]:
        """Each backend's weight in the route as the Gateway serves it."""
        return self.backends(self.served.get(name, {}))

    def written_backends(self, name: str) -> dict[str, int]:
        """Each backend's weight in the route as stored (written, accepted or not)."""
        return self.backends(self.routes.get(name, {}).get("spec", {}))

    @staticmethod
    def backends(spec: dict[str, Any]) -> dict[str, int]:
        """Each backend's weight in a route spec's rules (Gateway API's default weight is 1)."""
        weights: dict[str, int] = {}
        for rule in spec.get("rules", []):
            for ref in rule.get("backendRefs") or []:
                weights[ref["name"]] = weights.get(ref["name"], 0) + int(ref.get("weight", 1))
        return weights

    def _store(self, name: str, body: dict[str, Any], generation: int, status: dict[str, Any]) -> None:
        self._versions += 1
        metadata = {**body["metadata"], "generation": generation, "resourceVersion": str(self._versions)}
        self.routes[name] = {**copy.deepcopy(body), "metadata": metadata, "status": copy.deepcopy(status)}


def _apply_operation(target: dict[str, Any], operation: dict[str, Any], name: str) -> None:
    *parents, last = [part.replace("~1", "/").replace("~0", "~") for part in operation["path"].split("/")[1:]]
    node: Any = target
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    key: Any = int(last) if isinstance(node, list) and last != "-" else last
    op = operation["op"]
    if op == "test":
        current = node.get(key) if isinstance(node, dict) else node[key]
        if current != operation["value"]:
            raise kube.Conflict(f"HTTPRoute {name} changed since it was read")
    elif op == "add" and isinstance(node, list):
        node.insert(len(node) if key == "-" else key, copy.deepcopy(operation["value"]))
    elif op in ("add", "replace"):
        node[key] = copy.deepcopy(operation["value"])
    elif op == "remove":
        del node[key]
    else:
        raise ValueError(f"JSON patch op {op} is not modelled")
