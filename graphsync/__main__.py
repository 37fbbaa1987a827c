"""`python -m graphsync`: the same command line as the `graphsync` console script."""
from cli.main import main

if __name__ == "__main__":
    main(prog_name="graphsync")
