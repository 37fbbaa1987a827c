"""An unchanged multi-tower training script (tests/test_run.py runs it under `graphsync run`,
`python -m graphsync run` and plain python): one training step in each loop asked for, each on
its own graph, then the variables of every loop saved to OUT (.npz, keys LOOP/VARIABLE).

    python train.py OUT [--loop session|monitored|supervisor]... [--sizes 3,5] [--hook]

--hook adds graphsync.SyncBatchNormHook() to the MonitoredTrainingSession's hooks.
"""
import argparse

import numpy as np

from tower_model import CONFIG, build, model_variables, tf, tf1


def session_loop(sizes, hooks):
    train_op, feed = build(sizes)
    with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(train_op, feed)
        return sess.run(model_variables())


def monitored_loop(sizes, hooks):
    train_op, feed = build(sizes)
    variables = model_variables()
    with tf1.train.MonitoredTrainingSession(config=CONFIG, hooks=hooks, log_step_count_steps=None,
                                            save_checkpoint_secs=None, save_summaries_steps=None) as sess:
        sess.run(train_op, feed)
        return sess.run(variables)


def supervisor_loop(sizes, hooks):
    train_op, feed = build(sizes)
    variables = model_variables()
    supervisor = tf1.train.Supervisor(logdir=None, summary_op=None, saver=None)
    with supervisor.managed_session(config=CONFIG) as sess:
        sess.run(train_op, feed)
        return sess.run(variables)


LOOPS = {"session": session_loop, "monitored": monitored_loop, "supervisor": supervisor_loop}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--loop", action="append", choices=sorted(LOOPS))
    parser.add_argument("--sizes", default="3,5")
    parser.add_argument("--hook", action="store_true")
    args = parser.parse_args()
    hooks = []
    if args.hook:
        import graphsync
        hooks.append(graphsync.SyncBatchNormHook())
    sizes = [int(s) for s in args.sizes.split(",")]
    saved = {}
    for loop in args.loop or ["session"]:
        with tf.Graph().as_default():
            for name, value in LOOPS[loop](sizes, hooks).items():
                saved[f"{loop}/{name}"] = value
    np.savez(args.out, **saved)
    print(f"trained {len(args.loop or ['session'])} loop(s) on towers of {sizes}")


if __name__ == "__main__":
    main()
