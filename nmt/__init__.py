"""nmt: neural machine translation from YAML config to sacreBLEU score."""

__version__ = "0.1.0"
