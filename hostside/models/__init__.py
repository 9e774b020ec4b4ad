"""The model installer's parts, by concern (its command line is :mod:`hostside.fetch_model`).

:mod:`.common` (error, status lines, units, settings), :mod:`.transport` (pipeline, progress,
resumable downloads), :mod:`.archive` (safe unpacking), :mod:`.store` (layout, manifest,
switch, check, rollback, prune, remove, the one install shape), :mod:`.sources` (url, file),
:mod:`.peers` (a URL's file from peers first, the origin last), :mod:`.blobs` (verified
archives kept for peers), :mod:`.huggingface` (hf). A subpackage rather than ``model_*.py``
modules beside the other programs: these are one program's parts, uploaded together, never run
alone.
"""
