"""Bagua's launchers: ``python -m bagua.distributed.launch`` (Bagua's static flags) and
``python -m bagua.distributed.run`` (torchrun's flags plus Bagua's). Both run on
``torch.distributed.run`` (see _bagua_flags.py)."""
