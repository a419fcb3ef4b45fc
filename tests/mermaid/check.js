// Parses Mermaid diagrams with the real Mermaid library (tests/mermaid/setup.sh installs it)
// and prints what it read, for tests/report.rs: stdin is a JSON array of diagram sources,
// stdout a JSON array with, per diagram, {ok, error} and the flowchart's vertices (id,
// text, classes), edges (start, end, text) and class definitions.
// Usage: NODE_PATH=/usr/share/nodejs node check.js MERMAID_MIN_JS < sources.json
'use strict';
const fs = require('fs');
const vm = require('vm');
const { JSDOM } = require('jsdom');

const dom = new JSDOM('<!DOCTYPE html><body></body>');
globalThis.window = dom.window;
globalThis.document = dom.window.document;
vm.runInThisContext(fs.readFileSync(process.argv[2], 'utf8'));
const mermaid = globalThis.mermaid;
mermaid.initialize({ startOnLoad: false, securityLevel: 'strict' });

async function read(src) {
  try {
    await mermaid.parse(src);
    const d = await mermaid.mermaidAPI.getDiagramFromText(src);
    const db = d.db;
    const vertices = [...db.getVertices().values()].map((v) => ({
      id: v.id, text: v.text, classes: v.classes,
    }));
    const edges = db.getEdges().map((e) => ({ start: e.start, end: e.end, text: e.text }));
    const classes = [...db.getClasses().keys()];
    return { ok: true, type: d.type, vertices, edges, classes };
  } catch (e) {
    return { ok: false, error: String((e && e.message) || e) };
  }
}

(async () => {
  const sources = JSON.parse(fs.readFileSync(0, 'utf8'));
  const out = [];
  for (const s of sources) out.push(await read(s));
  process.stdout.write(JSON.stringify(out));
})();
