"""vllm-fleet's deploy: every concern in order, for every host of the inventory.

Run it with the fleet inventory, which validates the fleet file before any host is touched:

    pyinfra -y inventory.py deploy.py                      # the default fleet
    FLEET=inventory/examples/workstation-4090.yaml pyinfra inventory.py deploy.py
"""

from deploys.cuda import cuda
from deploys.endpoints import retired_routers, router_tools, routers
from deploys.host_tuning import host_tuning
from deploys.models import models
from deploys.monitoring import monitoring
from deploys.nvidia import nvidia
from deploys.os_tuning import os_tuning
from deploys.plan import current_plan
from deploys.services import retired_servers, services
from deploys.vllm_env import vllm_env

# The stack under vLLM: NVIDIA parts only on hosts that declare os.nvidia / os.cuda.
nvidia()
cuda()
limits_changed = host_tuning()
os_tuning()
# Servers renamed or taken out of the fleet file: stopped and removed before any other starts.
retired_servers()
# The rolling updates of replicas (in services) drive their routers with this program.
router_tools()
# A host without servers gets the stack only (e.g. a GPU host prepared ahead of its models).
if current_plan().stack.serves:
    venv_changed = vllm_env()
    models_changed = models()
    services(
        venv_changed=venv_changed, models_changed=models_changed, limits_changed=limits_changed
    )
# Prometheus and its exporters (and what the fleet file no longer has of them, removed).
monitoring()
# Endpoint routers after the servers: a first deploy starts them with their replicas serving.
retired_routers()
routers()
