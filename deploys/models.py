"""Model archives: downloaded by the host, SHA256-verified in the same pass, switched atomically.

Example:
    from deploys.models import models
    changed = models()      # {"tiny-llama": OperationMeta}
"""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import files

from deploys import ops
from deploys.plan import current_plan, script


@deploy("Models")
def models() -> dict[str, OperationMeta]:
    """Install every model this host's servers use; return each model's operation."""
    plan = current_plan()
    installer = f"{plan['remote_dir']}/fetch_model.py"
    files.put(
        name="Upload the model installer",
        src=script("fetch_model.py"),
        dest=installer,
        user="root",
        group="root",
        mode="755",
    )
    files.directory(
        name="Create the models directory",
        path=plan["models_dir"],
        user="root",
        group="root",
        mode="755",
    )
    changed = {}
    for model in plan["models"]:
        if model["url"] is None:
            raise DeployError(
                f"model {model['name']}: Hugging Face sources are not supported by this version "
                "yet; publish an archive with its sha256 and use url + sha256"
            )
        changed[model["name"]] = ops.model_installed(
            name=f"Install model {model['name']}",
            model=model["name"],
            url=model["url"],
            sha256=model["sha256"],
            path=model["path"],
            models_dir=plan["models_dir"],
            script=installer,
        )
    return changed
