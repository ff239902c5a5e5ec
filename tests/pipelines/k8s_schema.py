"""Validate emitted Kubernetes objects against the published API models, strictly.

    openapi_errors(doc, "KubeflowOrgV1PyTorchJob") -> ["$.spec.pytorchReplicaSpecs.Master.replicas: ..."]
    pydantic_errors(doc, TrainerV1alpha1TrainJob)  -> [...]

PyTorchJob (kubeflow.org/v1): the kubeflow-training SDK's OpenAPI models (and the kubernetes client's for
core types) declare, per class, `openapi_types` (attribute → type string such as 'list[V1Container]' or
'dict(str, str)') and `attribute_map` (attribute → JSON key). The walk rejects unknown keys, wrong types and
missing required fields (a setter that raises on None), naming the JSON path. Resource quantities are
int-or-string in the API server (the models type them str): ints are accepted there only.

TrainJob (trainer.kubeflow.org/v1alpha1): kubeflow-trainer-api's pydantic models (strict str/int/bool). They
ignore unknown keys, so the document must also survive a round trip unchanged: a key the API does not know
(e.g. the pre-2.1 `podTemplateOverrides`) disappears in `to_dict()` and is reported.
"""

from __future__ import annotations

import re
from typing import Any

_LIST = re.compile(r"^list\[(.+)\]$")
_DICT = re.compile(r"^dict\(([^,]+), (.+)\)$")
_QUANTITY_KEYS = ("limits", "requests")


def _model_class(name: str):
    import kubeflow.training.models as kubeflow
    import kubernetes.client.models as core

    for module in (kubeflow, core):
        cls = getattr(module, name, None)
        if cls is not None:
            return cls
    raise KeyError(f"no OpenAPI model named {name}")


def _required(cls) -> set[str]:
    """Attributes whose setter refuses None under client-side validation (the API's required fields)."""
    from kubernetes.client import Configuration

    probe = cls.__new__(cls)
    probe.local_vars_configuration = Configuration()
    required = set()
    for attr in cls.openapi_types:
        try:
            setattr(probe, attr, None)
        except ValueError:
            required.add(attr)
    return required


def openapi_errors(value: Any, type_name: str, path: str = "$", parent_key: str = "") -> list[str]:
    """Every way `value` (parsed YAML/JSON) breaks the OpenAPI type `type_name`, as 'path: problem' lines."""
    if value is None:
        return []
    if m := _LIST.match(type_name):
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        return [e for i, v in enumerate(value) for e in openapi_errors(v, m.group(1), f"{path}[{i}]")]
    if m := _DICT.match(type_name):
        if not isinstance(value, dict):
            return [f"{path}: expected a mapping, got {type(value).__name__}"]
        return [e for k, v in value.items() for e in openapi_errors(v, m.group(2), f"{path}.{k}", parent_key)]
    if type_name == "object":
        return []
    if type_name == "str":
        quantity = parent_key in _QUANTITY_KEYS and isinstance(value, int) and not isinstance(value, bool)
        return [] if isinstance(value, str) or quantity else [f"{path}: expected a string, got {value!r}"]
    if type_name == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
        return [] if ok else [f"{path}: expected an integer, got {value!r}"]
    if type_name == "bool":
        return [] if isinstance(value, bool) else [f"{path}: expected true/false, got {value!r}"]
    if type_name in ("float", "datetime", "date"):
        return []
    cls = _model_class(type_name)
    if not isinstance(value, dict):
        return [f"{path}: expected a {type_name} mapping, got {type(value).__name__}"]
    by_key = {key: attr for attr, key in cls.attribute_map.items()}
    errors = [f"{path}.{k}: unknown field of {type_name} (known: {', '.join(sorted(by_key))})"
              for k in value if k not in by_key]
    errors += [f"{path}.{cls.attribute_map[a]}: required by {type_name}, missing"
               for a in sorted(_required(cls)) if cls.attribute_map[a] not in value]
    for key, v in value.items():
        if key in by_key:
            errors += openapi_errors(v, cls.openapi_types[by_key[key]], f"{path}.{key}", key)
    return errors


def _diff(a: Any, b: Any, path: str = "$") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: not a field of the API (dropped by the model)" for k in a if k not in b]
        return out + [e for k in a if k in b for e in _diff(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        return [e for i, (x, y) in enumerate(zip(a, b, strict=False)) for e in _diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} became {b!r}"]


def pydantic_errors(value: dict, model) -> list[str]:
    """Validation errors of `model.from_dict(value)` plus every key lost in the round trip."""
    from pydantic import ValidationError

    try:
        parsed = model.from_dict(value)
    except ValidationError as e:
        return [f"$.{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()]
    return _diff(value, parsed.to_dict())
