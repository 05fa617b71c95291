#!/usr/bin/env bash
# Re-fetch the dashboard's map library and outlines from the npm registry into
# coordinator/dashboard/static/vendor/ (what `knnmon dashboard` serves: no CDN at run time).
# The packages' sha256 are checked; change a version here and its checksum together.
set -euo pipefail
cd "$(dirname "$0")/.."
V=coordinator/dashboard/static/vendor
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
declare -A SHA=(
  [leaflet-1.9.4.tgz]=84c65a256e50657896f54c33bd857b6849ebe94c817803be818bf32a3dde0b77
  [topojson-client-3.1.0.tgz]=889fadb422f6236d0f8337a236ce6499f258b75e44b81733b13bd971067322bf
  [us-atlas-3.0.1.tgz]=e6daba1800885868303ad3549da62f85a557b8142bb72629ec15651de62f9c5d
  [world-atlas-2.0.2.tgz]=032e7765f2ce00edaeafec23ff22bc3b77e42987c257da944cc585b452c05b97
)
(cd "$T" && npm pack --silent leaflet@1.9.4 topojson-client@3.1.0 us-atlas@3.0.1 world-atlas@2.0.2 >/dev/null)
for f in "${!SHA[@]}"; do
  echo "${SHA[$f]}  $T/$f" | sha256sum -c --quiet
  mkdir -p "$T/${f%.tgz}" && tar xzf "$T/$f" -C "$T/${f%.tgz}"
done
mkdir -p $V/leaflet/images $V/topojson-client $V/us-atlas $V/world-atlas
cp "$T"/leaflet-1.9.4/package/dist/{leaflet.js,leaflet.css} "$T"/leaflet-1.9.4/package/LICENSE $V/leaflet/
cp "$T"/leaflet-1.9.4/package/dist/images/*.png $V/leaflet/images/
cp "$T"/topojson-client-3.1.0/package/dist/topojson-client.min.js "$T"/topojson-client-3.1.0/package/LICENSE $V/topojson-client/
cp "$T"/us-atlas-3.0.1/package/{states-10m.json,LICENSE} $V/us-atlas/
cp "$T"/world-atlas-2.0.2/package/{countries-110m.json,LICENSE} $V/world-atlas/
echo "vendored into $V"
