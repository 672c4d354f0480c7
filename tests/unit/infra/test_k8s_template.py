"""The Kubernetes base job template for gpu-pool: every placeholder is a declared variable, and
rendered with its defaults it asks for a GPU on a GPU node."""

from __future__ import annotations

import json
from pathlib import Path

from prefect.utilities.templating import apply_values, find_placeholders

TEMPLATE = Path(__file__).resolve().parents[3] / "infra" / "k8s" / "gpu-pool-base-job-template.json"


def test_placeholders_are_declared_and_defaults_request_a_gpu():
    template = json.loads(TEMPLATE.read_text())
    declared = set(template["variables"]["properties"])
    used = {p.name for p in find_placeholders(template["job_configuration"])}
    assert used <= declared, used - declared

    defaults = {
        k: v["default"] for k, v in template["variables"]["properties"].items() if "default" in v
    }
    rendered = apply_values(template["job_configuration"], defaults | {"env": {}, "labels": {}})
    pod = rendered["job_manifest"]["spec"]["template"]["spec"]
    resources = pod["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 1 == resources["requests"]["nvidia.com/gpu"]
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["restartPolicy"] == "Never"
