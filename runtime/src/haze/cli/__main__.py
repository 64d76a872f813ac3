"""``python -m haze.cli``: the same as the ``haze`` console script."""

from haze.cli import main

if __name__ == "__main__":
    main()
