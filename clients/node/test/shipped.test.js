// src/rl.lua, src/rl_functions.lua and src/ranges.json are committed copies, so the package works wherever it is
// copied or installed (a symlink into ../lua or ../vectors dangles outside the repository).
// They must stay byte for byte the shared sources every library ships.
import { test } from "node:test";
import assert from "node:assert/strict";
import { lstatSync, readFileSync } from "node:fs";

const pairs = [["src/rl.lua", "../lua/rl.lua"], ["src/rl_functions.lua", "../lua/rl_functions.lua"],
  ["src/ranges.json", "../vectors/ranges.json"]];

for (const [copy, source] of pairs) {
  test(`${copy} is a file equal to clients/${source.slice(3)}`, () => {
    const at = (p) => new URL(`../${p}`, import.meta.url);
    assert.ok(lstatSync(at(copy)).isFile(), `${copy} must be a regular file, not a link`);
    assert.ok(readFileSync(at(copy)).equals(readFileSync(at(source))),
      `${copy} differs from clients/${source.slice(3)}: run cp clients/${source.slice(3)} clients/node/${copy}`);
  });
}
