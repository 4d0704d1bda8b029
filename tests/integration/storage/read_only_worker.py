"""What a serving process does at start-up, on a ps.json whose L3 folder is read-only:
import check, open L3 as the topology says, fill L2, answer lookups. Prints a JSON line.

Run as ``python -m tests.integration.storage.read_only_worker PS_JSON TABLE KEYS_FILE``
(by the test, as an unprivileged user when it runs as root: root may write anywhere).
"""

from __future__ import annotations

import json
import sys

import numpy as np

from hps.build import build_session
from hps.topology import topology
from hps.triton.serving import fill_l2, prepare_tables, serving_config


def main() -> None:
    ps, table, keys_file = sys.argv[1:4]
    config = serving_config(ps)
    imported = prepare_tables(config)
    mode = topology(config).model(config.models[0].model).l3_mode or "read_only"
    session = build_session(config, l3_mode=mode)
    try:
        rows = fill_l2(session, config, config.models[0])
        keys = np.load(keys_file)
        out = session.lookup(table, keys)
    finally:
        session.close()
    print(json.dumps({"imported": imported, "mode": mode, "l2_rows": rows, "out": out.tolist()}))


if __name__ == "__main__":
    main()
