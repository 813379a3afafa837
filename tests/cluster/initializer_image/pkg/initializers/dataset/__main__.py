"""`python -m pkg.initializers.dataset`, what the dataset initializer image runs: STORAGE_URI into /workspace/dataset."""

from pkg.initializers.fetch import main

if __name__ == "__main__":
    main("/workspace/dataset", "dataset")
