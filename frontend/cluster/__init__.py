"""The frontend's cluster room: its table of components (table.py, members.py), the replica
router (routing.py), /health's report (health.py) and the client that sends requests
into the pipeline and routes what comes back (engine_client.py; failing.py: how it fails
what a dead component held).

The frontend's view of its cluster: which components are in it, which are alive, what a
dead one took with it, and which scheduler replica takes the next request. Pure
bookkeeping on one table: callers pass `now` (the frontend's own monotonic receipt time,
so clock skew between hosts does not matter) and act on the events returned (`Joined`:
connect to the replica's inbox; `Failed`: fail what the component held). EngineClient
feeds it from the inbox and the sockets' disconnect watches, and runs the watchdog.

```
 inbox ── EngineStatus, ComponentStatus ──▶ on_status ──▶ Joined / Failed
       ── TextOutputs ───────────────────▶ on_outputs (proves the detok and its replica)
 a replica's / the detok's connection closes ──▶ on_disconnect ──▶ Failed
 watchdog, every WATCHDOG_S ──▶ check ──▶ Failed (windows lapsed, tokenizer work lost)
 /health ◀── missing(), report()       submit ◀── choose() (routing.Router's policy),
                                               choose_tokenizer(), sent(), forget()
```

The table, one row (`Member`) per component by name: "detok", "scheduler.K" per scheduler
replica K ("scheduler", from an older sender, is replica 0), "tokenizer.PID" per
tokenizer worker. "scheduler" as a whole is up while at least one replica is, "tokenizer"
while one worker is.

Liveness: a member is alive when it spoke within `window_s` = max(3 s, 3 × heartbeat_s):
  scheduler.K    its EngineStatus ("ready" or "heartbeat"), or a TextOutputs of its step
  detok          ComponentStatus("detok"), or any TextOutputs (only the detok sends them)
  tokenizer.PID  ComponentStatus("tokenizer") from that pid, sent from its main loop (a
                 hung worker falls silent too; tokenizing never takes seconds)
A "stopping" status marks the sender down at once (a replica's comes through the detok,
behind its last outputs), and so does a replica's or the detok's connection closing (the
process died). One guard, GUARD_S, follows a disconnect: during it only a "ready" (from a
restarted successor) revives the member, not the dead process's last messages still on
their way; and what a disconnected replica held fails only when it ends, so that its last
outputs, still in the detok, land first (its clean "stopping" ends the wait at once).

Joins: a replica joins with its EngineStatus (id, pid, inbox, model facts, KV pool;
`proof` that it holds ipc.secret). Refused, with one log line each: another model (or
other model facts than the replicas already in), a wrong secret, and a second process
claiming a live replica's id at another inbox. The same id at the same inbox with a new
pid is that replica restarted: what the old process held fails; so for a detok with a new
pid. A replica's ComponentStatus counts only from the pid that joined.

Model facts (common.model_facts.ModelFacts: model, vocab_size, max_model_len,
block_size) have one owner, the replicas, which announce what they loaded; `facts()` is
theirs, and the frontend uses it (the routing key's block_size, the intake checks'
vocabulary and context). A tokenizer worker states what it computed in every status; one
that differs from the replicas is refused, with one log line: it counts as down and gets
no request (checked again whenever a replica joins, since workers often come first).

Tokenizer hand-offs: the frontend picks the worker for each request (the live one
holding the fewest, then the least recently picked) and sends it to that worker alone, so
it knows who holds what without a word from the workers. A worker holds a request until
its first output or error (or its abort). When a worker dies or hangs, what it holds fails
with 503 (`Failed("tokenizer", why, rids)`): what it had not passed on, and also what it
had passed on that has not produced a token yet (the client aborts those at their
replica), the price of having no acknowledgements.

The client (engine_client.py). Data parallelism: one PUSH socket per scheduler replica, connected when the replica joins
(frontend.cluster's `Joined`), its connection watched (PeerWatch) for a sudden death. The frontend picks the replica before
tokenizing (frontend.cluster.routing) and the TokenizeRequest names it, so the tokenizer worker
sends it there; a request's aborts go to that replica (`RequestHandle.replica`).

The inbox is read by one background thread (block once, then drain: one event-loop
wake-up per batch, and msgpack decoding off the loop), so the loop never blocks on
ZeroMQ. The two PUSH sockets are used only from the loop, with non-blocking sends.
`dispatch` runs on the loop and routes each entry of a TextOutputs (one message per
engine step, many requests) through `routes: rid -> (handle, choice index)`. A rid
leaves `routes` when it finishes, fails or is aborted; outputs for rids not in `routes`
(unknown, finished, aborted) are dropped silently. Which components are alive, what a dead
one took with it, and which replica takes a request, is frontend.cluster's: this client
feeds it, runs its watchdog, and acts on the events it returns (connect, fail).
"""
