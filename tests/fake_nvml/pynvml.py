"""A FAKE pynvml for soakd subprocesses under test: no GPU runs here, so this stands in for
nvidia-ml-py's NVML bindings. It is ``tests.test_telemetry.make_fake_pynvml`` with
``SOAKD_FAKE_NVML_GPUS`` GPUs (default 2) whose UUIDs are ``GPU-fake<i>``; put this folder
first on PYTHONPATH (``tests.test_gpu_devices.fake_nvml_env``). Every answer is made up."""

import os
import sys

from tests.test_telemetry import make_fake_pynvml

_n = int(os.environ.get("SOAKD_FAKE_NVML_GPUS", "2"))
sys.modules[__name__] = make_fake_pynvml(uuids=tuple(f"GPU-fake{i}" for i in range(_n)))
