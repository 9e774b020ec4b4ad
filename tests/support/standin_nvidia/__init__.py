"""A STAND-IN for NVIDIA's apt repository and GPUs, for the GPU-stack tests on sandbox hosts.

Not NVIDIA software: packages with NVIDIA's names and versions (``build.py``) whose programs
print the formats captured from real GPUs (``tests/fixtures/nvidia``), and the "hardware" of a
sandbox host (``hardware.py``: a PCI listing and a GPU description file, which a real host has
before any driver is installed).
"""
