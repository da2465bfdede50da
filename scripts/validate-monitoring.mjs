// Validates prometheus-operator objects (PrometheusRule, ServiceMonitor,
// PodMonitor) against monitoring.coreos.com/v1's schema, with the validators
// npm's @kubernetes-models/prometheus-operator generates from
// prometheus-operator's API types (types, required fields, enums, patterns;
// that schema lets unknown fields through, which scripts/check-observability.py
// checks itself).
// Usage: node scripts/validate-monitoring.mjs NODE_MODULES < objects.json
// where objects.json is [{"source": "...", "object": {...}}, ...].
// Exits 1 naming each object and field that does not validate.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const modules = process.argv[2];
if (!modules) {
  console.error("usage: node scripts/validate-monitoring.mjs NODE_MODULES < objects.json");
  process.exit(2);
}
const pkg = join(modules, "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1");
const kinds = {};
for (const kind of ["PrometheusRule", "ServiceMonitor", "PodMonitor"]) {
  kinds[kind] = (await import(pathToFileURL(join(pkg, `${kind}.js`)).href))[kind];
}
const items = JSON.parse(readFileSync(0, "utf8"));
let failed = 0;
for (const { source, object } of items) {
  const Model = kinds[object.kind];
  const name = `${source} ${object.kind} ${object.metadata?.name}`;
  if (!Model) {
    console.log(`${name}: no schema for kind ${object.kind}`);
    failed++;
    continue;
  }
  try {
    new Model(object).validate();
  } catch (e) {
    console.log(`${name} does not validate against monitoring.coreos.com/v1: ${e.message}`);
    failed++;
  }
}
process.exit(failed ? 1 : 0);
