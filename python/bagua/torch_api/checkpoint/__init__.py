from .checkpointing import load_checkpoint, save_checkpoint  # noqa: F401
from .elastic import latest_step, load_training_state, save_training_state  # noqa: F401
