"""`python -m moelab.cli ...`: the same CLI as the `moelab` script (the embedded adapter uses it)."""
from moelab.cli import main

if __name__ == "__main__":
    main()
