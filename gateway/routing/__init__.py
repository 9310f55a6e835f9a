"""Which worker of a pool a request goes to, as plug-ins in the manner of the Gateway API Inference Extension's
scheduler: ``filters`` narrow the pool (available now, with room, pinned), ``deciders`` each name a worker the
request would run best on within the load bound of ``candidates`` (prefix match, session rendezvous, first-block
hash), a picker from ``pickers`` answers when none does (least load, round robin), and an after-dispatch hook
(the ``prefixes`` index) learns where each try was sent and forgets a try that failed. ``profiles`` builds a
pool's router from ``pools.<pool>.routing`` once; ``affinity`` names a request's prompt blocks. Imports the
fleet's worker model only; never upstream (upstream imports it). Why prefix affinity within a load bound:
docs/decisions/007-prefix-routing.md."""
