"""``TrainingArguments``: the class (transformers' fields, names and defaults), its checks, the fields compared
with the installed transformers, the setters, the older releases' fields, what the engine receives from it
(settings, the DeepSpeed config translated)."""
