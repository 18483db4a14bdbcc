"""Offline recipe data and metrics: synthetic MNIST/IMDB, local tokenizer, accuracy module, plots."""

import json
import sys
import time

import datasets  # a core dependency of trainkit: a broken install must fail here, not skip
import numpy as np
import pytest

import synthetic_digits
import synthetic_reviews
from common.metrics import LOCAL_METRICS_DIR, load_metric
from common.plotting import plot_history


# --- digits -----------------------------------------------------------------------------------


def test_digits_are_deterministic_by_seed_and_stream():
    images, labels = synthetic_digits.make_digits(100, seed=3)
    again_images, again_labels = synthetic_digits.make_digits(100, seed=3)
    np.testing.assert_array_equal(images, again_images)
    np.testing.assert_array_equal(labels, again_labels)
    assert not np.array_equal(images, synthetic_digits.make_digits(100, seed=4)[0])
    assert not np.array_equal(images, synthetic_digits.make_digits(100, seed=3, stream=1)[0])


def test_digits_shapes_dtypes_and_balance():
    images, labels = synthetic_digits.make_digits(205, seed=0)
    assert images.shape == (205, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (205,) and labels.dtype == np.int64
    counts = np.bincount(labels, minlength=10)
    assert counts.min() == 20 and counts.max() == 21
    # A bright digit on a dark background, like MNIST.
    assert (images.reshape(205, -1).max(axis=1) > 200).all()
    assert images.mean() < 80


def test_synthetic_mnist_matches_hub_schema():
    ds = synthetic_digits.synthetic_mnist(num_train=30, num_test=20, seed=0)
    assert set(ds) == {"train", "test"}
    assert (ds["train"].num_rows, ds["test"].num_rows) == (30, 20)
    expected = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=[str(d) for d in range(10)])}
    )
    assert ds["train"].features == expected
    example = ds["test"][0]
    assert example["image"].mode == "L" and example["image"].size == (28, 28)
    assert isinstance(example["label"], int)
    # Train and test are different draws.
    assert np.asarray(ds["train"][0]["image"]).tobytes() != np.asarray(example["image"]).tobytes()


def test_pillow_default_font_fallback(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    fonts = synthetic_digits._load_fonts()
    assert len(fonts) == 1
    glyph = synthetic_digits._render_glyph(fonts[0], 7, weight=0)
    assert glyph.shape == (28 * synthetic_digits.SUPERSAMPLE,) * 2 and glyph.max() > 0.5


# --- reviews, tokenizer, model config ---------------------------------------------------------


def test_reviews_deterministic_lengths_and_balance():
    texts, labels = synthetic_reviews.make_reviews(400, seed=1)
    assert synthetic_reviews.make_reviews(400, seed=1)[0] == texts
    assert synthetic_reviews.make_reviews(400, seed=2)[0] != texts
    lengths = [len(text.split()) for text in texts]
    assert min(lengths) >= synthetic_reviews.MIN_WORDS and max(lengths) <= synthetic_reviews.MAX_WORDS
    assert labels.dtype == np.int64 and labels.sum() == 200
    assert sum(" not " in text for text in texts) > 40  # negations are common


def test_synthetic_imdb_matches_hub_schema():
    ds = synthetic_reviews.synthetic_imdb(num_train=20, num_test=10, seed=0)
    assert set(ds) == {"train", "test"}
    expected = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["neg", "pos"])})
    assert ds["train"].features == expected
    assert isinstance(ds["test"][0]["text"], str) and ds["test"][0]["label"] in (0, 1)


@pytest.fixture(scope="module")
def tokenizer():
    texts, _ = synthetic_reviews.make_reviews(300, seed=0)
    return synthetic_reviews.train_wordpiece_tokenizer(texts, vocab_size=400)


def test_tokenizer_round_trip_and_special_tokens(tokenizer):
    text = "The acting was NOT good. I watched it on a Friday with my sister."
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
    assert tokenizer.pad_token_id == 0 and tokenizer.unk_token_id is not None
    decoded = tokenizer.decode(ids, skip_special_tokens=True)
    assert decoded.replace(" ", "") == text.lower().replace(" ", "")


def test_tokenizer_pads_with_collator_and_saves(tokenizer, tmp_path):
    from transformers import AutoTokenizer, DataCollatorWithPadding

    features = [tokenizer("i loved it"), tokenizer("the plot was not very clever at all, sadly")]
    batch = DataCollatorWithPadding(tokenizer)(features)
    short = len(features[0]["input_ids"])
    assert batch["input_ids"].shape[0] == 2 and batch["input_ids"].shape[1] == len(features[1]["input_ids"])
    assert (batch["input_ids"][0, short:] == 0).all() and (batch["attention_mask"][0, short:] == 0).all()
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded("i loved it")["input_ids"] == features[0]["input_ids"]


def test_tiny_bert_config_builds_a_classifier(tokenizer):
    import torch
    from transformers import BertForSequenceClassification, DataCollatorWithPadding

    config = synthetic_reviews.tiny_bert_config(len(tokenizer))
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (128, 2, 2)
    assert config.intermediate_size == 512 and config.num_labels == 2
    model = BertForSequenceClassification(config)
    batch = DataCollatorWithPadding(tokenizer)([tokenizer("great film"), tokenizer("not good at all")])
    with torch.no_grad():
        assert model(**batch).logits.shape == (2, 2)


# --- metrics ------------------------------------------------------------------------------------


def test_local_accuracy_module_matches_hand_computation(monkeypatch):
    import evaluate

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_EVALUATE_OFFLINE", "1")
    metric = evaluate.load(str(LOCAL_METRICS_DIR / "accuracy"))
    rng = np.random.default_rng(0)
    predictions, references = rng.integers(0, 3, 50), rng.integers(0, 3, 50)
    weights = rng.random(50)
    correct = predictions == references
    result = metric.compute(predictions=predictions, references=references)
    assert result == {"accuracy": pytest.approx(correct.mean())}
    assert metric.compute(predictions=predictions, references=references, normalize=False)["accuracy"] == correct.sum()
    weighted = metric.compute(predictions=predictions, references=references, sample_weight=weights)
    assert weighted["accuracy"] == pytest.approx((correct * weights).sum() / weights.sum())
    # The hub module's documented example.
    example = metric.compute(
        references=[0, 1, 2, 0, 1, 2], predictions=[0, 1, 1, 2, 1, 0], sample_weight=[0.5, 2, 0.7, 0.5, 9, 0.4]
    )
    assert example["accuracy"] == pytest.approx(0.8778625954198473)
    multilabel = evaluate.load(str(LOCAL_METRICS_DIR / "accuracy"), "multilabel")
    assert multilabel.compute(predictions=[[0, 1], [1, 1]], references=[[0, 1], [1, 0]])["accuracy"] == 0.5


def test_load_metric_offline_uses_local_copy_without_waiting(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    metric = load_metric("accuracy")
    assert time.monotonic() - start < 10
    assert metric.compute(predictions=[1, 0, 1, 1], references=[1, 1, 1, 0]) == {"accuracy": 0.5}
    with pytest.raises(FileNotFoundError):
        load_metric("no_such_metric")


# --- plotting -----------------------------------------------------------------------------------


def _history():
    rows = [{"loss": 2.0 / step, "learning_rate": 1e-3, "epoch": step / 10, "step": step} for step in range(1, 21)]
    rows += [{"eval_loss": 0.5, "eval_accuracy": 0.9, "epoch": 2.0, "step": 20}, {"train_runtime": 1.0, "step": 20}]
    return rows


def test_plot_history_writes_png(tmp_path):
    out = plot_history(_history(), tmp_path / "plots" / "curves.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 1000


def test_plot_history_reads_jsonl_without_accuracy(tmp_path):
    path = tmp_path / "log.jsonl"
    rows = [row for row in _history() if "eval_accuracy" not in row]
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    out = plot_history(str(path), tmp_path / "curves.png")
    assert out.stat().st_size > 1000
