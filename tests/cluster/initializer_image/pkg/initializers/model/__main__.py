"""`python -m pkg.initializers.model`, what the model initializer image runs: STORAGE_URI into /workspace/model."""

from pkg.initializers.fetch import main

if __name__ == "__main__":
    main("/workspace/model", "pre-trained model")
