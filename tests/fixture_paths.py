"""Where the bundled fixture graphs (fixtures/make_fixtures.py) live."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "fixtures")
META1 = os.path.join(FIXTURES, "cifar10_1tower.meta")
META2 = os.path.join(FIXTURES, "cifar10_2towers.meta")
META4 = os.path.join(FIXTURES, "cifar10_4towers.meta")
MOMENTS1 = os.path.join(FIXTURES, "moments_1tower.meta")
MOMENTS2 = os.path.join(FIXTURES, "moments_2towers.meta")
FORWARD = os.path.join(FIXTURES, "forward_2towers.pb")
SAVEDMODEL = os.path.join(FIXTURES, "savedmodel_2towers")
CHECKPOINT = os.path.join(FIXTURES, "cifar10_2towers.ckpt")
