"""A script with several graphs, run unchanged under `graphsync run`: one training graph without
towers, one multi-tower graph the script synchronizes itself with rewrite_towers(), one multi-tower
graph it leaves to whoever runs it, and (with `broken`) a multi-tower graph graphsync must refuse
(the towers' layers differ). Prints the op count of each graph before and after its step."""
import sys

from tower_model import CONFIG, build, data, tf, tf1, tower_loss


def one_step(name, make):
    with tf.Graph().as_default() as graph:
        train_op, feed = make()
        init = tf1.global_variables_initializer()
        before = len(graph.get_operations())
        with tf1.Session(config=CONFIG) as sess:
            sess.run(init)
            sess.run(train_op, feed)
        print(f"{name}: {before} -> {len(graph.get_operations())} ops")


def without_towers():
    images, labels = data(4)
    loss = tower_loss(tf.constant(images), tf.constant(labels), 4)
    with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
        return tf1.train.GradientDescentOptimizer(0.1).minimize(loss), {}


def rewritten_by_the_script():
    import graphsync
    train_op, feed = build([2, 2])
    graphsync.rewrite_towers()
    return train_op, feed


def broken():
    """tower_1 has a batch norm tower_0 lacks: graphsync refuses the whole graph."""
    feed, losses = {}, []
    for i in range(2):
        with tf.device(f"/cpu:{i}"), tf1.name_scope(f"tower_{i}"), tf1.variable_scope("model", reuse=tf1.AUTO_REUSE):
            x = tf1.placeholder(tf.float32, [None, 4], name="x")
            feed[x] = [[1.0, 2.0, 3.0, 4.0], [0.0, 1.0, 0.0, 2.0]]
            h = tf1.layers.batch_normalization(x, training=True, name="bn")
            if i == 1:
                h = tf1.layers.batch_normalization(h, training=True, name="extra")
            losses.append(tf.reduce_sum(tf.square(h)))
    return tf.add_n(losses), feed


one_step("no towers", without_towers)
one_step("rewritten by the script", rewritten_by_the_script)
one_step("left to graphsync", lambda: build([2, 2]))
if sys.argv[1:] == ["broken"]:
    one_step("broken", broken)
    print("the script went on")
