"""Building the model to check: a TARGET loaded, --init, its inputs, torchvision's zoo.
"""
