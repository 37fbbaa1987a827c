"""`graphsync` console script (placeholder until the saved-graph commands land)."""
import click


@click.group()
@click.version_option(package_name="graphsync")
def main():
    """Synchronized batch norm for TF1 multi-tower graphs."""
