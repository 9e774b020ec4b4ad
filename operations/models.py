"""Operations of models: install (download or push, verify, switch) one model of the host plan.

Example:
    from operations.models import model_installed
    model_installed(name="Install model tiny", model=plan.models[0], ...)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, QuoteString, StringCommand, operation
from pyinfra.api.exceptions import DeployError

from facts.models import ModelCheck
from fleet.hostplan.types import ModelInstall

#: The installer's flag for progress lines on the host.
PROGRESS_EVERY_S = 10


class StreamedCommand(StringCommand):
    """A shell command whose output pyinfra prints line by line as it arrives.

    The installer prints download progress (bytes, rate, ETA); pyinfra normally shows a
    command's output only with ``-v`` or when it fails. Here every line appears at once,
    prefixed with the host's name.
    """

    def execute(self, state: Any, host: Any, connector_arguments: Any) -> Any:
        connector_arguments.update(self.connector_arguments)
        return host.run_shell_command(
            self, print_output=True, print_input=state.print_input, **connector_arguments
        )


def install_command(
    model: ModelInstall, models_dir: str, script_path: str, python: str, deep: bool
) -> list[str]:
    """The installer's command line for one model of the host plan (no secrets in it).

    Example:
        >>> install_command(ModelInstall(name="tiny", path="/m/tiny", kind="url",
        ...     url="http://h/t.tar.gz", sha256="a" * 64, unpack=True, filename="t.tar.gz"),
        ...     "/m", "/s/fetch_model.py", "python3", False)[:6]
        ['python3', '/s/fetch_model.py', 'install', '--name', 'tiny', '--models-dir']
    """
    words = [python, script_path, "install", "--name", model.name, "--models-dir", models_dir,
             "--keep", str(model.keep), "--progress-every", str(PROGRESS_EVERY_S)]
    if model.kind == "hf":
        words += ["--hf", model.hf, "--revision", model.revision]
        if model.endpoint:
            words += ["--endpoint", model.endpoint]
        if model.token:
            words += ["--token-stdin"]
    else:
        if model.kind == "url":
            words += ["--url", model.url, "--retries", str(model.retries),
                      "--retry-wait", f"{model.retry_wait:g}"]
        else:
            words += ["--file", upload_path(model, models_dir)]
        words += ["--sha256", model.sha256, "--unpack", "yes" if model.unpack else "no",
                  "--filename", model.filename]
    if deep:
        words.append("--deep")
    return words


def upload_path(model: ModelInstall, models_dir: str) -> str:
    """Where a local file is pushed on the host (the installer's private staging folder)."""
    return f"{models_dir}/.staging/{model.name}-{model.sha256[:16]}.upload"


@operation()
def model_installed(
    model: ModelInstall, models_dir: str, script_path: str, python: str, check: str = "quick"
):
    """Make the model's live path serve exactly this version, intact, verified before use.

    + model: one entry of the host plan's ``models`` (source, sha256 or revision, keep)
    + models_dir: where versions, staging and the live links are
    + script_path: the host-side installer (fetch_model.py)
    + python: interpreter for it (the vLLM venv's for Hugging Face models)
    + check: ``quick`` (sizes, mtimes) or ``deep`` (re-hash every file) before saying intact

    **Example:**

    .. code:: python

        model_installed(name="Install model tiny", model=plan.models[0],
                        models_dir="/var/lib/vllm-fleet/models",
                        script_path="/usr/local/lib/vllm-fleet/fetch_model.py",
                        python="python3")
    """
    deep = check == "deep"
    report = host.get_fact(
        ModelCheck, script=script_path, model=model.name, models_dir=models_dir, deep=deep
    )
    want = model.id
    same = bool(report and report.get("installed") and report.get("id") == want)
    if same and report.get("ok"):  # type: ignore[union-attr]
        host.noop(f"model {model.name} {want[:16]} is installed and intact ({check} check)")
        return
    if same:
        problems = report.get("problems", [])  # type: ignore[union-attr]
        listed = "; ".join(f"{p['path']}: {p['problem']}" for p in problems[:5])
        logger.warning(
            f"{host.print_prefix}model {model.name}: the installed copy differs from its "
            f"manifest ({listed}); installing it again"
        )
    if model.kind == "file":
        local = Path(model.file)
        if not local.is_file():
            raise DeployError(
                f"model {model.name}: {local} does not exist on this machine; copy the file "
                "there or fix file: in the fleet file"
            )
        yield FileUploadCommand(str(local), upload_path(model, models_dir))
    words = install_command(model, models_dir, script_path, python, deep)
    stdin = {"_stdin": model.token + "\n"} if model.token else {}
    yield StreamedCommand(*[QuoteString(word) for word in words], **stdin)
