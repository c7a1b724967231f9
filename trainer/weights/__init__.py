"""Weights from every zoo our users come from: reading and detecting files, name mappings, strict loading, and the
zoo of published Kinetics weights behind ``CONFIG.MODEL.PRETRAINED``."""

from trainer.weights.formats import WeightsError, WeightsFile, read_weights
from trainer.weights.loading import LoadReport, load_weights

__all__ = ["LoadReport", "WeightsError", "WeightsFile", "load_weights", "read_weights"]
