"""Stage 2: costs. Measured on real devices, estimated by roofline, or predicted (xgb)."""
from .cache import MeasureCache
from .roofline import roofline_costs

__all__ = ["MeasureCache", "roofline_costs"]
