"""What every tensorpack export script of the tests shares: the trainers, and building a model
under each chosen trainer with a TensorInput, then exporting the graph as the trainer left it."""
import os

import tensorflow as tf
from tensorpack import SyncMultiGPUTrainerParameterServer, SyncMultiGPUTrainerReplicated, TensorInput

TRAINERS = {"replicated": lambda towers: SyncMultiGPUTrainerReplicated(towers),
            "ps": lambda towers: SyncMultiGPUTrainerParameterServer(towers, ps_device="cpu")}


def export(out: str, trainers, towers: int, make_model, random_inputs) -> None:
    """One `<trainer>.meta` in `out` per trainer name (default: replicated), devices kept."""
    os.makedirs(out, exist_ok=True)
    for trainer_name in trainers or ["replicated"]:
        with tf.Graph().as_default():
            model = make_model()
            trainer = TRAINERS[trainer_name](towers)
            trainer.setup_graph(model.get_input_signature(), TensorInput(random_inputs), model.build_graph,
                                model.get_optimizer)
            path = os.path.join(out, f"{trainer_name}.meta")
            tf.compat.v1.train.export_meta_graph(path, clear_devices=False)
        print(f"wrote {path}")
