"""Pipeline configuration: one frozen dataclass per stage, loaded from YAML.

Each stage validates itself when it is built, so a config object that exists is a valid one. Loading
from YAML keeps the line of every key, so an error reads
``pipeline.yaml:12: preprocess.mean: expected 3 numbers, got 2`` and points at the line to fix.

The package: :mod:`~edgert.config.schema` (the dataclasses and their bounds), :mod:`~edgert.config.convert`
(:func:`from_mapping`: plain data to dataclasses, type by type) and :mod:`~edgert.config.loader`
(:func:`load_config`: bounded YAML reading, key lines, paths relative to the file). PyYAML is imported only
when a file is loaded: ``import edgert`` needs numpy alone.
"""

from __future__ import annotations

from edgert.config.convert import from_mapping
from edgert.config.loader import MAX_CONFIG_BYTES, MAX_CONFIG_NODES, load_config
from edgert.config.schema import (
    MAX_IMAGE_SIDE,
    MAX_QUEUE_SIZE,
    TRACKERS,
    AnalyticsConfig,
    AsrConfig,
    DecodeConfig,
    FieldError,
    LineConfig,
    ModelConfig,
    PipelineConfig,
    PowerConfig,
    PreprocessConfig,
    RuntimeConfig,
    SourceConfig,
    SpeechConfig,
    TrackConfig,
    VadConfig,
    WakeWordConfig,
    ZoneConfig,
)

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_NODES",
    "MAX_IMAGE_SIDE",
    "MAX_QUEUE_SIZE",
    "TRACKERS",
    "AnalyticsConfig",
    "AsrConfig",
    "DecodeConfig",
    "FieldError",
    "LineConfig",
    "ModelConfig",
    "PipelineConfig",
    "PowerConfig",
    "PreprocessConfig",
    "RuntimeConfig",
    "SourceConfig",
    "SpeechConfig",
    "TrackConfig",
    "VadConfig",
    "WakeWordConfig",
    "ZoneConfig",
    "from_mapping",
    "load_config",
]

