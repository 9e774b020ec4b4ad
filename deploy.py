"""vllm-fleet's deploy: every concern in order, for every host of the inventory.

Run it with the fleet inventory, which validates the fleet file before any host is touched:

    pyinfra -y inventory.py deploy.py                      # the default fleet
    FLEET=inventory/examples/workstation-4090.yaml pyinfra inventory.py deploy.py
"""

from deploys.models import models
from deploys.os_tuning import os_tuning
from deploys.services import services
from deploys.vllm_env import vllm_env

os_tuning()
venv_changed = vllm_env()
models_changed = models()
services(venv_changed=venv_changed, models_changed=models_changed)
