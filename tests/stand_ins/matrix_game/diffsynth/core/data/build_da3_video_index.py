"""Stand-in of ``diffsynth/core/data/build_da3_video_index.py``: the index scanner CLI."""

from __future__ import annotations

import argparse
import os
import sqlite3

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--camera_params_path", required=True)
    p.add_argument("--output_path", required=True)
    a, _ = p.parse_known_args()
    con = sqlite3.connect(a.output_path)
    con.execute("CREATE TABLE IF NOT EXISTS records (clean_name TEXT, scan_error TEXT)")
    for name in sorted(os.listdir(a.camera_params_path)):
        con.execute("INSERT INTO records VALUES (?, NULL)", (name,))
    con.commit()
    con.close()
