"""Models: downloaded (or pushed) by the host, verified in one pass, switched atomically.

Every model that this host's servers use is installed by the host-side installer
(``hostside/fetch_model.py``): an HTTP(S) archive or single file with its SHA256 (resumed
with ``Range`` after an interruption), a file on the control machine pushed to the host, or a
Hugging Face repo at a pinned commit (through the vLLM venv's huggingface_hub, every file
verified against the hub's hashes). Each deploy checks the installed version quickly (sizes and
modification times against its manifest; ``--data model_check=deep`` re-hashes everything) and
does nothing more when it is intact; a damaged version is installed again. The servers of a
model restart only when its operation changed (see :mod:`deploys.services`). Download progress
(bytes, rate, ETA) is printed per host as it happens.

Example:
    from deploys.models import models
    changed = models()      # {"tiny-llama": OperationMeta}
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import apt, files

from deploys.plan import current_plan, upload_program
from fleet.hostplan.modelplan import model_check
from operations.models import model_installed


@deploy("Models")
def models() -> dict[str, OperationMeta]:
    """Install every model this host's servers use; return each model's operation."""
    plan = current_plan()
    try:
        check = model_check(host.data.get("model_check"))
    except ValueError as error:
        raise DeployError(str(error)) from None
    installer, _ = upload_program("fetch_model", "the model installer")
    files.directory(
        name="Create the models directory",
        path=plan.models_dir,
        user="root",
        group="root",
        mode="755",
    )
    files.directory(
        name="Create the private staging directory",
        path=plan.staging_dir,
        user="root",
        group="root",
        mode="700",
    )
    if any(model.needs_zstd for model in plan.models):
        apt.packages(
            name="Install zstd (for .tar.zst models)",
            packages=["zstd"],
            update=True,
            cache_time=24 * 3600,
        )
    changed = {}
    for model in plan.models:
        python = plan.python_bin if model.kind == "hf" else "python3"
        changed[model.name] = model_installed(
            name=f"Install model {model.name}",
            model=model,
            models_dir=plan.models_dir,
            script_path=installer,
            python=python,
            check=check,
        )
    return changed
