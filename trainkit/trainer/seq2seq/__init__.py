"""Sequence-to-sequence training: ``Seq2SeqTrainer`` and ``Seq2SeqTrainingArguments``, transformers' names."""
