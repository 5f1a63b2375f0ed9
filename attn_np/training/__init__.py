"""The chapter-5 training kit: the rest of a small transformer, its loss,
optimiser, task and loop.

* :mod:`~attn_np.training.layers`: embedding, sinusoidal positions, linear,
  RMSNorm, GELU and the feed-forward block, each a forward/backward pair with
  a thin layer shell;
* :mod:`~attn_np.training.transformer`: the pre-norm block and the
  decoder-only transformer;
* :mod:`~attn_np.training.losses`: masked cross-entropy and accuracy;
* :mod:`~attn_np.training.optim`: Adam and gradient-norm clipping;
* :mod:`~attn_np.training.tasks`: multi-query associative recall;
* :mod:`~attn_np.training.loop`: the training loop, its learning-rate
  schedule and evaluation.
"""

from .layers import (
    Embedding,
    FeedForward,
    Linear,
    RMSNorm,
    check_token_ids,
    embedding_backward,
    embedding_forward,
    gelu_backward,
    gelu_forward,
    linear_backward,
    linear_forward,
    rmsnorm_backward,
    rmsnorm_forward,
    sinusoidal_positions,
)
from .loop import TrainLog, evaluate, lr_at, train, train_many
from .losses import accuracy, cross_entropy_backward, cross_entropy_forward
from .optim import Adam, clip_grad_norm
from .tasks import AssociativeRecall, RecallBatch
from .transformer import Block, Transformer

__all__ = [
    "Adam",
    "AssociativeRecall",
    "Block",
    "Embedding",
    "FeedForward",
    "Linear",
    "RMSNorm",
    "RecallBatch",
    "TrainLog",
    "Transformer",
    "accuracy",
    "check_token_ids",
    "clip_grad_norm",
    "cross_entropy_backward",
    "cross_entropy_forward",
    "embedding_backward",
    "embedding_forward",
    "evaluate",
    "gelu_backward",
    "gelu_forward",
    "linear_backward",
    "linear_forward",
    "lr_at",
    "rmsnorm_backward",
    "rmsnorm_forward",
    "sinusoidal_positions",
    "train",
    "train_many",
]
