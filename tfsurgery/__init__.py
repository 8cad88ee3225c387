"""tfsurgery: make trained TensorFlow graphs lean for inference, and prove the numbers held."""
__version__ = "0.1.0"
