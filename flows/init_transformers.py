"""``sweepflow init DIR --template transformers``: a text classifier trained by a Hugging Face ``Trainer`` on
each rank through ``ddp_runtime.huggingface.transformers`` (Ray's ``ray.train.huggingface.transformers``
names): a small BERT-style model built from a ``BertConfig`` and a word-level tokenizer built from the training
split (no download), on a generated corpus of reviews."""

from __future__ import annotations

import numpy as np

ROWS = 1200

_POSITIVE = ("great", "lovely", "excellent", "fun", "charming", "superb", "moving", "bright")
_NEGATIVE = ("dull", "awful", "boring", "weak", "clumsy", "tedious", "bland", "poor")
_NEUTRAL = (
    "the", "film", "plot", "was", "and", "a", "cast", "music", "story", "with", "very", "quite", "scenes",
    "ending", "start", "acting", "it", "of", "too", "some", "director", "camera", "screen", "long",
)


def reviews_csv(rows: int = ROWS, seed: int = 0) -> str:
    """Generated reviews: label 1 when a review holds more positive than negative words (ties never occur)."""
    rng = np.random.default_rng(seed)
    lines = ["text,label"]
    for _ in range(rows):
        label = int(rng.integers(0, 2))
        strong, weak = (_POSITIVE, _NEGATIVE) if label else (_NEGATIVE, _POSITIVE)
        n_strong = int(rng.integers(1, 4))
        words = [*rng.choice(strong, n_strong), *rng.choice(weak, int(rng.integers(0, n_strong))),
                 *rng.choice(_NEUTRAL, int(rng.integers(4, 12)))]
        rng.shuffle(words)
        lines.append(f"{' '.join(words)},{label}")
    return "\n".join(lines) + "\n"


MODEL_PY = '''"""{package}'s model: a small BERT-style review classifier, trained by a Hugging Face Trainer on each DDP rank
(ddp_runtime.huggingface.transformers: Ray Train's Transformers integration). Nothing is downloaded: the model
is built from a BertConfig and the tokenizer (word level) from the training split's words.

The four functions sweepflow's pipeline calls (sweep.yaml names them):
    train_fn(config)                      every rank of every trial: transformers.Trainer, reports each epoch's
                                          eval_accuracy with the Trainer's checkpoint (RayTrainReportCallback)
    model_fn(checkpoint)                  the best checkpoint's model for the registry: token ids in, logits out,
                                          with an input example of tokenized sentences
    evaluate_fn(checkpoint, data_path)    the test-set metrics of the best checkpoint (logged as test_<name>)
config["data_path"] is the prepared data: train.csv, val.csv, test.csv and schema.json (format: csv).
Needs the transformers extra: pip install 'sweepflow[transformers]'.
"""

from __future__ import annotations

import os

import fsspec
import numpy as np
import pandas as pd
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from torch import nn
from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast, Trainer, TrainingArguments

import ddp_runtime as train
from ddp_runtime.huggingface.transformers import RayTrainReportCallback, prepare_trainer

MAX_LENGTH = 24
SPECIAL = ["[PAD]", "[UNK]", "[CLS]"]


def load_split(data_path: str, split: str) -> pd.DataFrame:
    with fsspec.open(f"{{data_path}}/{{split}}.csv", "r") as f:
        return pd.read_csv(f)


def build_tokenizer(texts) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the words of ``texts`` (sorted: the same vocabulary on every rank)."""
    words = sorted({{w for text in texts for w in text.split()}})
    vocab = {{token: i for i, token in enumerate(SPECIAL + words)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single="[CLS] $A", special_tokens=[("[CLS]", vocab["[CLS]"])])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]")


class Reviews(torch.utils.data.Dataset):
    def __init__(self, table: pd.DataFrame, tokenizer: PreTrainedTokenizerFast) -> None:
        self.encoded = tokenizer(list(table["text"]), padding="max_length", truncation=True, max_length=MAX_LENGTH)
        self.labels = table["label"].to_numpy()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        item = {{k: torch.tensor(v[i]) for k, v in self.encoded.items() if k != "token_type_ids"}}
        item["labels"] = torch.tensor(int(self.labels[i]))
        return item


def accuracy(prediction) -> dict[str, float]:
    return {{"accuracy": float((np.argmax(prediction.predictions, axis=-1) == prediction.label_ids).mean())}}


def train_fn(config: dict) -> None:
    train_table, val_table = load_split(config["data_path"], "train"), load_split(config["data_path"], "val")
    tokenizer = build_tokenizer(train_table["text"])
    torch.manual_seed(config.get("seed", 0))
    model = BertForSequenceClassification(
        BertConfig(
            vocab_size=len(tokenizer), hidden_size=config["hidden"], num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=2 * config["hidden"], max_position_embeddings=MAX_LENGTH, num_labels=2,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    args = TrainingArguments(
        output_dir=os.path.join(train.get_context().get_trial_dir(), "hf"),
        eval_strategy="epoch",
        save_strategy="epoch",
        logging_strategy="epoch",
        save_total_limit=1,
        num_train_epochs=config["epochs"],
        learning_rate=config["lr"],
        per_device_train_batch_size=config["batch_size"],
        per_device_eval_batch_size=256,
        use_cpu=not torch.cuda.is_available(),
        report_to=[],
        disable_tqdm=True,
        seed=config.get("seed", 0),
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Reviews(train_table, tokenizer),
        eval_dataset=Reviews(val_table, tokenizer),
        processing_class=tokenizer,  # saved into every checkpoint: model_fn and evaluate_fn read it back
        compute_metrics=accuracy,
        callbacks=[RayTrainReportCallback()],
    )
    trainer = prepare_trainer(trainer)
    checkpoint = train.get_checkpoint()
    if checkpoint is None:
        trainer.train()
        return
    # a restarted trial, or one that PBT or HyperBand continues: from its last epoch
    with checkpoint.as_directory() as d:
        trainer.train(resume_from_checkpoint=os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME))


class Classifier(nn.Module):
    """Token ids (padded with [PAD]) in, the two classes' logits out: what the registered model serves."""

    def __init__(self, bert: BertForSequenceClassification, pad_id: int) -> None:
        super().__init__()
        self.bert, self.pad_id = bert, pad_id

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=input_ids, attention_mask=(input_ids != self.pad_id).long()).logits


def _load(checkpoint: train.Checkpoint) -> tuple[Classifier, PreTrainedTokenizerFast]:
    with checkpoint.as_directory() as d:
        path = os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME)
        bert = BertForSequenceClassification.from_pretrained(path)
        tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
    return Classifier(bert.eval(), tokenizer.pad_token_id).eval(), tokenizer


def model_fn(checkpoint: train.Checkpoint) -> tuple[nn.Module, np.ndarray]:
    """The classifier, and tokenized sentences as its input example (token ids: the raw text is not a tensor)."""
    model, tokenizer = _load(checkpoint)
    example = tokenizer(["a great film", "a dull and tedious story", "the cast was superb", "boring"],
                        padding="max_length", truncation=True, max_length=MAX_LENGTH, return_tensors="np")
    return model, example["input_ids"].astype(np.int64)


def evaluate_fn(checkpoint: train.Checkpoint, data_path: str) -> dict[str, float]:
    model, tokenizer = _load(checkpoint)
    test = load_split(data_path, "test")
    ids = tokenizer(list(test["text"]), padding="max_length", truncation=True, max_length=MAX_LENGTH,
                    return_tensors="pt")["input_ids"]
    labels = torch.tensor(test["label"].to_numpy())
    with torch.no_grad():
        logits = model(ids)
    return {{
        "accuracy": float((logits.argmax(-1) == labels).float().mean()),
        "loss": float(nn.functional.cross_entropy(logits, labels)),
    }}
'''

SWEEP_YAML = """# {package}: sweepflow's pipeline on this Transformers project. Paths are relative to this file.
#   sweepflow run --config sweep.yaml          (README.md: what each part is)
data:
  source: data/reviews.csv     # any fsspec URL or path: s3://bucket/reviews.csv, https://..., a directory
  format: csv                  # split without code: train.csv / val.csv / test.csv + schema.json
  target: label
training:
  train_fn: {package}.model:train_fn
  model_fn: {package}.model:model_fn
  epochs: 6
evaluation:
  evaluate_fn: {package}.model:evaluate_fn
sweep:
  search_space:
    hidden: {{type: choice, values: [32, 64]}}
    lr: {{type: loguniform, low: 1.0e-3, high: 5.0e-3}}
    batch_size: {{type: choice, values: [16, 32]}}
  num_samples: 4
scheduler: {{metric: eval_accuracy, mode: max, max_t: 6, grace_period: 2}}
resources: {{ranks_per_trial: 2}}
selection: {{metric: eval_accuracy, mode: max, champion_metric: test_accuracy, champion_mode: max}}
mlflow: {{experiment_name: {package}, registered_model_name: {package}-reviews}}
"""

#: The template's requirement beyond sweepflow (pyproject's dependencies).
EXTRA = "transformers"
