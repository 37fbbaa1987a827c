"""Unchanged multi-tower scripts that open their session before they build the model
(tests/test_run_session_first.py runs them under `graphsync run` and plain python): one SGD
step per mode asked for, each mode's variables saved to OUT (.npz, keys MODE/VARIABLE).

    python train_session_first.py OUT [--mode interactive|with|unrelated|tower0-first]... [--sizes 3,5]

interactive   `sess = tf.compat.v1.InteractiveSession()` before anything else (on the process's
              default graph, so it runs first when asked for)
with          `with tf.Graph().as_default(), tf.compat.v1.Session() as sess:` around the whole script
unrelated     a session that runs an unrelated part of the graph (the global step's initializer
              and a sum) before the towers are built
tower0-first  a session that runs tower 0's forward pass as a sanity check before the other
              towers are built
"""
import argparse

import numpy as np

from tower_model import CONFIG, build, model_variables, tf, tf1


def one_step(sess, sizes, after_tower=None):
    train_op, feed = build(sizes, after_tower=after_tower)
    sess.run(tf1.global_variables_initializer())
    sess.run(train_op, feed)
    return sess.run(model_variables())


def interactive(sizes):
    sess = tf1.InteractiveSession(config=CONFIG)
    try:
        return one_step(sess, sizes)
    finally:
        sess.close()


def with_session(sizes):
    with tf.Graph().as_default(), tf1.Session(config=CONFIG) as sess:
        return one_step(sess, sizes)


def unrelated(sizes):
    with tf.Graph().as_default():
        sess = tf1.Session(config=CONFIG)
        step = tf1.train.get_or_create_global_step()
        sess.run(step.initializer)
        print("unrelated sum:", sess.run(tf.reduce_sum(tf.range(10))))
        with sess:
            return one_step(sess, sizes)


def tower0_first(sizes):
    with tf.Graph().as_default(), tf1.Session(config=CONFIG) as sess:
        def sanity_check(i, loss, feed):
            if i == 0:
                sess.run(tf1.global_variables_initializer())
                print(f"tower 0 loss before training: {sess.run(loss, feed):.4f}")
        return one_step(sess, sizes, sanity_check)


MODES = {"interactive": interactive, "with": with_session, "unrelated": unrelated, "tower0-first": tower0_first}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--mode", action="append", choices=sorted(MODES))
    parser.add_argument("--sizes", default="3,5")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = sorted(args.mode or ["with"], key=lambda mode: mode != "interactive")
    saved = {}
    for mode in modes:
        for name, value in MODES[mode](sizes).items():
            saved[f"{mode}/{name}"] = value
        print(f"{mode}: trained one step on towers of {sizes}")
    np.savez(args.out, **saved)


if __name__ == "__main__":
    main()
