"""The single source of truth of a run: one frozen dataclass tree (``schema``), its validation
(``checks``), named presets (``presets``) and TRL GRPOConfig keys (``trl``).

``from grpo.config import Config, build_config, ConfigError`` is the public import path.
"""

from grpo.config.schema import *  # noqa: F401,F403  (the public names of the schema)
from grpo.config.build import *  # noqa: F401,F403  (build_config, load_yaml, to_dict, valid_keys, field_help)
from grpo.config.schema import _f  # noqa: F401  (field helper, used by the schema's sections)
