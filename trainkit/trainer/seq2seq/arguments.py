"""Seq2SeqTrainingArguments: TrainingArguments plus transformers' five generation fields, same names and defaults.

``HfArgumentParser`` reads it as it reads transformers' class (``generation_config`` parses as a string: a
folder, a ``generation_config.json`` file or a Hub id, loaded by the Trainer as transformers loads it).
"""

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import GenerationConfig

from trainkit.config.errors import ConfigError
from trainkit.trainer.training_arguments.arguments import TrainingArguments, reject_unknown_keywords

logger = logging.getLogger(__name__)

WHERE = "Seq2SeqTrainingArguments"


@dataclass
class Seq2SeqTrainingArguments(TrainingArguments):
    """TrainingArguments for :class:`~trainkit.Seq2SeqTrainer` (see docs/trainer.md, "Sequence to sequence")."""

    sortish_sampler: bool = field(default=False, metadata={"help": "Accepted for transformers' scripts; transformers 5 does not read it either (a notice says so): for length-grouped batches use train_sampling_strategy='group_by_length'."})
    predict_with_generate: bool = field(default=False, metadata={"help": "Evaluate and predict with generate(): predictions are generated token ids (for ROUGE, BLEU), not logits."})
    generation_max_length: int | None = field(default=None, metadata={"help": "max_length for generate() in evaluate/predict (default: the model's generation_config)."})
    generation_num_beams: int | None = field(default=None, metadata={"help": "num_beams for generate() in evaluate/predict (default: the model's generation_config)."})
    generation_config: str | Path | GenerationConfig | None = field(default=None, metadata={"help": "A GenerationConfig, or a folder, generation_config.json file or Hub id to load one from; replaces the model's generation_config."})

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("generation_max_length", "generation_num_beams"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name}={value!r} in {WHERE} must be a positive integer or None.")
        if not isinstance(self.generation_config, (str, Path, GenerationConfig, type(None))):
            raise ConfigError(f"generation_config={self.generation_config!r} in {WHERE} must be a GenerationConfig, a "
                              "path (folder or generation_config.json) or a Hub model id.")
        if self.sortish_sampler:
            logger.warning("sortish_sampler=True has no effect: transformers 5 no longer reads it, nor does trainkit "
                           "(use train_sampling_strategy='group_by_length' for batches of similar lengths).")
        if (self.generation_max_length is not None or self.generation_num_beams is not None) and not self.predict_with_generate:
            logger.warning("generation_max_length/generation_num_beams are read only with predict_with_generate=True "
                           "(evaluate/predict otherwise return the model's logits).")

    def to_dict(self) -> dict[str, Any]:
        """As TrainingArguments.to_dict, with a GenerationConfig as its dict (JSON-serialisable, as transformers)."""
        result = super().to_dict()
        for key, value in result.items():
            if isinstance(value, GenerationConfig):
                result[key] = value.to_dict()
        return result


reject_unknown_keywords(Seq2SeqTrainingArguments)

__all__ = ["Seq2SeqTrainingArguments"]
