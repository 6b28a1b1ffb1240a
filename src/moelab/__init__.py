"""moelab: find the fastest MoE serving configuration that actually works, and say why the others do not."""

__version__ = "0.1.0"
