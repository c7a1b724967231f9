"""Experiment configuration: a GluonCV-compatible schema with defaults, YAML loading, overrides, validation, dump.

A GluonCV ``*_kinetics400.yaml`` (``DDP_CONFIG`` + ``CONFIG.{TRAIN,VAL,INFERENCE,DATA,MODEL,LOG}``) loads unchanged;
keys GluonCV lacks (AMP, gradient clipping and accumulation, seeds, resume, ...) have defaults that keep its
behaviour. Every problem is reported before anything starts, as a ``ConfigError`` naming the file and dotted key.

| module | its one job |
|---|---|
| section | what every section shares: strict keys, rules across a section's keys, user paths, keys not provided |
| ddp | DDP_CONFIG and its rules (nodes, ranks, rendezvous) |
| sections | CONFIG's sections (TRAIN, VAL, INFERENCE, DATA, MODEL, LOG) and their rules |
| schema | Config, the recipe, the rules across sections |
| messages | a validation error as one line per dotted key |
| files | YAML in and out, ``KEY VALUE`` overrides, the paths a config reads, the run's folder, the schema described |
| __main__ | ``python -m trainer.config``: validate a file (``--check``), print it resolved, ``--describe`` |

Checks against the node a config runs on (GPUs, compiler, decoders) are ``trainer.node_checks``'s.
"""

from trainer.config.ddp import DDPConfig
from trainer.config.files import (
    apply_overrides,
    config_to_dict,
    config_to_yaml,
    describe_schema,
    dump_config,
    input_paths,
    load_config,
    parse_yaml,
    path_keys,
    run_dir,
    validate_config,
)
from trainer.config.schema import Config
from trainer.config.section import URLS_KEY, ConfigError
from trainer.config.sections import TrainConfig

__all__ = [
    "URLS_KEY",
    "Config",
    "ConfigError",
    "DDPConfig",
    "TrainConfig",
    "apply_overrides",
    "config_to_dict",
    "config_to_yaml",
    "describe_schema",
    "dump_config",
    "input_paths",
    "load_config",
    "parse_yaml",
    "path_keys",
    "run_dir",
    "validate_config",
]
