"""What a process sees of its Hub settings, for tests/test_cli_launcher.py (#48): run as `python -m
tests.hub_settings_probe` through the CLI launcher, warm (from a zygote that imported huggingface_hub and
transformers with another call's environment) or cold, it prints the values huggingface_hub and transformers hold
(read at import) and the library's own answers, as JSON; `modules` prints instead what was imported before it ran.

Example:
    $ HF_ENDPOINT=http://127.0.0.1:1 python -m tests.hub_settings_probe  # doctest: +SKIP
    {"preloaded": false, "endpoint": "http://127.0.0.1:1", ...}
"""

import sys
import threading

PRELOADED = sorted(sys.modules)  # before this module imports anything
THREADS = threading.active_count()

if sys.argv[1:] == ["modules"]:
    import json

    print(json.dumps({"modules": PRELOADED, "threads": THREADS}))
    raise SystemExit(0)

import json  # noqa: E402  (after the snapshot above)

import transformers.utils.hub  # noqa: E402
from huggingface_hub import constants, get_token, hf_api  # noqa: E402
from huggingface_hub.utils import are_progress_bars_disabled  # noqa: E402

print(json.dumps({
    "preloaded": "transformers" in PRELOADED,
    "endpoint": constants.ENDPOINT, "api_endpoint": hf_api.api.endpoint, "home": constants.HF_HOME,
    "hub_cache": constants.HF_HUB_CACHE, "token_path": constants.HF_TOKEN_PATH, "offline": constants.HF_HUB_OFFLINE,
    "token": get_token(), "modules_cache": transformers.utils.hub.HF_MODULES_CACHE,
    "progress_bars_disabled": are_progress_bars_disabled(), "xet_disabled": constants.HF_HUB_DISABLE_XET,
}))
