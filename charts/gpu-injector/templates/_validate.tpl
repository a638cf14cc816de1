{{/*
The webhook's configuration checks (config.Validate in config/config.go, and
layout.Plan.Validate for static layouts), run at render time: a configuration the
binary would refuse fails helm install, upgrade and template with the binary's own
message, instead of installing pods that crash-loop on it. values.schema.json already
refuses wrong types, unknown keys and values outside an enum; these are the rules it
cannot express: other fields (noLayout.staticLayout names a staticLayouts entry),
path.Match patterns, clean paths, system folders, and Kubernetes name formats.
charts/chart_test.go checks every rule against config.Validate, message for message.
*/}}

{{/*
gpu-injector.validateConfig fails the render with every error, formatted as the binary
formats them (field.ErrorList.ToAggregate).
*/}}
{{- define "gpu-injector.validateConfig" -}}
{{- $c := .Values.config }}
{{- $v := dict "errs" list "re" dict }}
{{- /* resources */}}
{{- range $i, $n := dig "resources" "names" list $c }}
{{- if or (not (include "gpu-injector.v.glob" $n)) (eq $n "") (not (contains "/" $n)) }}
{{- include "gpu-injector.v.invalid" (list $v (printf "resources.names[%d]" $i) $n "must be a qualified extended resource name or path.Match pattern, like nvidia.com/gpu or nvidia.com/mig-*") }}
{{- end }}
{{- end }}
{{- $renameTo := $c.resources.renameTo }}
{{- range $i, $n := dig "resources" "legacy" list $c }}
{{- with include "gpu-injector.v.qualifiedName" $n }}
{{- include "gpu-injector.v.invalid" (list $v (printf "resources.legacy[%d]" $i) $n .) }}
{{- end }}
{{- end }}
{{- range $i, $n := dig "resources" "legacy" list $c }}
{{- if eq $n $renameTo }}
{{- include "gpu-injector.v.invalid" (list $v (printf "resources.legacy[%d]" $i) $n "must differ from renameTo") }}
{{- end }}
{{- end }}
{{- with include "gpu-injector.v.qualifiedName" $renameTo }}
{{- include "gpu-injector.v.invalid" (list $v "resources.renameTo" $renameTo .) }}
{{- end }}
{{- /* renameToleration Add stands in for ExtendedResourceToleration, which only serves extended resource names (config.IsExtendedResourceName) */}}
{{- $extended := and (contains "/" $renameTo) (not (contains "kubernetes.io/" $renameTo)) (not (hasPrefix "requests." $renameTo)) (not (include "gpu-injector.v.qualifiedName" (printf "requests.%s" $renameTo))) }}
{{- if and (eq (dig "resources" "renameToleration" "Add" $c) "Add") (dig "resources" "legacy" list $c) (not $extended) }}
{{- include "gpu-injector.v.invalid" (list $v "resources.renameToleration" "Add" (printf "renameTo %q is no extended resource name (a domain outside kubernetes.io, like nvidia.com/gpu), for which the ExtendedResourceToleration admission plugin adds no toleration; set renameToleration: None" $renameTo)) }}
{{- end }}
{{- /* hostPaths: an empty allowlist is the schema's (minItems) */}}
{{- include "gpu-injector.v.allowlist" (list $v "hostPaths.allowlist" $c.hostPaths.allowlist) }}
{{- include "gpu-injector.v.allowlist" (list $v "hostPaths.extraAllowlist" (dig "hostPaths" "extraAllowlist" list $c)) }}
{{- range $i, $p := $c.hostPaths.driverFilePatterns }}
{{- if or (not (include "gpu-injector.v.glob" $p)) (eq $p "") (contains "/" $p) }}
{{- include "gpu-injector.v.invalid" (list $v (printf "hostPaths.driverFilePatterns[%d]" $i) $p "must be a file name pattern without '/'") }}
{{- end }}
{{- end }}
{{- /* containerPaths */}}
{{- range $name := list "libraryDir" "binaryDir" }}
{{- $p := get $c.containerPaths $name }}
{{- if or (not (include "gpu-injector.v.absClean" $p)) (eq $p "/") (contains ":" $p) }}
{{- include "gpu-injector.v.invalid" (list $v (printf "containerPaths.%s" $name) $p "must be an absolute, clean path other than / without ':'") }}
{{- end }}
{{- end }}
{{- /* ldLibraryPath, containers, layoutPolicy, podSecurity, legacyMounts, runtimeInjection: enums of the schema */}}
{{- /* dra */}}
{{- range $i, $n := dig "dra" "deviceClasses" list $c }}
{{- /* A class name is a DNS subdomain; a pattern may hold * ? [ ] as well. */}}
{{- $plain := $n | replace "*" "x" | replace "?" "x" | replace "[" "x" | replace "]" "x" }}
{{- if or (not (include "gpu-injector.v.glob" $n)) (include "gpu-injector.v.dnsSubdomain" (list $plain "characters")) }}
{{- include "gpu-injector.v.invalid" (list $v (printf "dra.deviceClasses[%d]" $i) $n "must be a DeviceClass name or path.Match pattern, like gpu.nvidia.com or *.gpu.nvidia.com") }}
{{- end }}
{{- end }}
{{- range $i, $n := dig "dra" "drivers" list $c }}
{{- with include "gpu-injector.v.dnsSubdomain" (list $n "characters") }}
{{- include "gpu-injector.v.invalid" (list $v (printf "dra.drivers[%d]" $i) $n .) }}
{{- end }}
{{- end }}
{{- /* noLayout: the action's values are the schema's */}}
{{- $static := dig "staticLayouts" list $c }}
{{- $staticLayout := dig "noLayout" "staticLayout" "" $c }}
{{- if eq (dig "noLayout" "action" "" $c) "Static" }}
{{- if eq $staticLayout "" }}
{{- include "gpu-injector.v.add" (list $v "noLayout.staticLayout: Required value: the name of a staticLayouts entry, with action Static") }}
{{- else }}
{{- $found := false }}
{{- range $static }}{{ if eq (get . "name") $staticLayout }}{{ $found = true }}{{ end }}{{ end }}
{{- if not $found }}
{{- include "gpu-injector.v.add" (list $v (printf "noLayout.staticLayout: Not found: %q" $staticLayout)) }}
{{- end }}
{{- end }}
{{- else if ne $staticLayout "" }}
{{- include "gpu-injector.v.invalid" (list $v "noLayout.staticLayout" $staticLayout "only used with action Static") }}
{{- end }}
{{- /* staticLayouts, checked as the binary checks a node's layout */}}
{{- $rules := dict
  "allowlist" (concat $c.hostPaths.allowlist (dig "hostPaths" "extraAllowlist" list $c))
  "patterns" $c.hostPaths.driverFilePatterns
  "roots" (list $c.containerPaths.libraryDir $c.containerPaths.binaryDir) }}
{{- $names := dict }}
{{- range $i, $s := $static }}
{{- $sp := printf "staticLayouts[%d]" $i }}
{{- $name := get $s "name" }}
{{- with include "gpu-injector.v.dnsLabel" $name }}
{{- include "gpu-injector.v.invalid" (list $v (printf "%s.name" $sp) $name .) }}
{{- end }}
{{- if hasKey $names $name }}
{{- include "gpu-injector.v.add" (list $v (printf "%s.name: Duplicate value: %q" $sp $name)) }}
{{- end }}
{{- $_ := set $names $name true }}
{{- include "gpu-injector.v.plan" (list $v $sp $s $rules) }}
{{- range $k, $val := (get $s "nodeSelector" | default dict) }}
{{- with include "gpu-injector.v.qualifiedName" $k }}
{{- include "gpu-injector.v.invalid" (list $v (printf "%s.nodeSelector[%s]" $sp $k) $k .) }}
{{- end }}
{{- with include "gpu-injector.v.labelValue" $val }}
{{- include "gpu-injector.v.invalid" (list $v (printf "%s.nodeSelector[%s]" $sp $k) $val .) }}
{{- end }}
{{- end }}
{{- end }}
{{- /* pinning: count, duplicates, our own prefix and rememberFor are the schema's */}}
{{- range $i, $k := dig "pinning" "nodeLabels" list $c }}
{{- with include "gpu-injector.v.qualifiedName" $k }}
{{- include "gpu-injector.v.invalid" (list $v (printf "pinning.nodeLabels[%d]" $i) $k .) }}
{{- end }}
{{- end }}
{{- range $i, $ns := dig "excludedNamespaces" list $c }}
{{- with include "gpu-injector.v.dnsLabel" $ns }}
{{- include "gpu-injector.v.invalid" (list $v (printf "excludedNamespaces[%d]" $i) $ns .) }}
{{- end }}
{{- end }}
{{- $errs := uniq $v.errs }}
{{- if eq (len $errs) 1 }}
{{- fail (printf "invalid configuration: %s" (first $errs)) }}
{{- else if $errs }}
{{- fail (printf "invalid configuration: [%s]" (join ", " $errs)) }}
{{- end }}
{{- end }}

{{/* gpu-injector.v.add appends a message: (list $v message). */}}
{{- define "gpu-injector.v.add" -}}
{{- $v := index . 0 }}
{{- $_ := set $v "errs" (append $v.errs (index . 1)) }}
{{- end }}

{{/* gpu-injector.v.invalid appends field.Invalid's message: (list $v field value detail). */}}
{{- define "gpu-injector.v.invalid" -}}
{{- include "gpu-injector.v.add" (list (index . 0) (printf "%s: Invalid value: %q: %s" (index . 1) (index . 2) (index . 3))) }}
{{- end }}

{{/*
gpu-injector.v.allowlist checks allowlist entries as validateAllowlist does:
(list $v field entries).
*/}}
{{- define "gpu-injector.v.allowlist" -}}
{{- $v := index . 0 }}
{{- range $i, $a := index . 2 }}
{{- $field := printf "%s[%d].path" (index $ 1) $i }}
{{- $p := get $a "path" }}
{{- if or (not (include "gpu-injector.v.absClean" $p)) (eq $p "/") }}
{{- include "gpu-injector.v.invalid" (list $v $field $p "must be an absolute, clean path other than /") }}
{{- else if not (include "gpu-injector.v.glob" $p) }}
{{- include "gpu-injector.v.invalid" (list $v $field $p "bad pattern: syntax error in pattern") }}
{{- else if not (get $a "filesOnly") }}
{{- with include "gpu-injector.v.systemFolder" (list $v $p) }}
{{- include "gpu-injector.v.add" (list $v (printf "%s: Forbidden: it would allow the system folder %s whole; allow it only with filesOnly: true, or name the driver's own folder" $field .)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
gpu-injector.v.systemFolder is sensitiveOverlap: the first folder that must never be
mounted whole which the entry (a path whose elements may be patterns) matches, lies
above, or whose ancestor it matches; else a folder of the host's secrets, devices or
runtime state the entry lies inside. (list $v entry). The lists are config.go's.
*/}}
{{- define "gpu-injector.v.systemFolder" -}}
{{- $v := index . 0 }}
{{- $entry := index . 1 }}
{{- $hits := list }}
{{- range $s := list "/etc" "/usr" "/usr/lib" "/usr/lib64" "/usr/bin" "/usr/sbin" "/usr/lib/x86_64-linux-gnu"
  "/usr/lib/aarch64-linux-gnu" "/lib" "/lib64" "/bin" "/sbin" "/var" "/root" "/home" "/proc"
  "/sys" "/dev" "/run" "/boot" "/var/lib/kubelet" "/var/lib/containerd" "/run/containerd"
  "/var/run" "/etc/kubernetes" "/var/log" "/opt" "/srv" "/tmp" }}
{{- if or (eq $entry $s) (hasPrefix (printf "%s/" $entry) $s) }}
{{- $hits = append $hits $s }}
{{- else }}
{{- range $q := fromJsonArray (include "gpu-injector.v.ancestors" $s) }}
{{- if include "gpu-injector.v.match" (list $v $entry $q) }}
{{- $hits = append $hits $s }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- range $s := list "/etc" "/proc" "/sys" "/dev" "/root" "/var/lib/kubelet" "/run/containerd" "/var/lib/containerd" }}
{{- if hasPrefix (printf "%s/" $s) $entry }}
{{- $hits = append $hits $s }}
{{- end }}
{{- end }}
{{- with $hits }}{{ first . }}{{ end }}
{{- end }}

{{/* gpu-injector.v.ancestors: a clean absolute path and every folder above it but /, as JSON. */}}
{{- define "gpu-injector.v.ancestors" -}}
{{- $out := list }}
{{- $q := "" }}
{{- range splitList "/" (trimPrefix "/" .) }}
{{- $q = printf "%s/%s" $q . }}
{{- $out = append $out $q }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
gpu-injector.v.plan is layout.Plan.Validate for a static layout, its fields under
prefix: (list $v prefix layout rules). The schema has the enums: schemaVersion,
runtimeInjection, a mount's kind.
*/}}
{{- define "gpu-injector.v.plan" -}}
{{- $v := index . 0 }}
{{- $sp := index . 1 }}
{{- $s := index . 2 }}
{{- $r := index . 3 }}
{{- $mounts := get $s "mounts" | default list }}
{{- $libs := get $s "libraryPaths" | default list }}
{{- $dv := get $s "driverVersion" | default "" }}
{{- if eq $dv "" }}
{{- include "gpu-injector.v.add" (list $v (printf "%s.driverVersion: Required value: the driver version the files belong to" $sp)) }}
{{- end }}
{{- range $name := list "driverVersion" "cudaDriverVersion" }}
{{- $ver := get $s $name | default "" }}
{{- if and $ver (not (regexMatch `^[0-9A-Za-z][0-9A-Za-z._-]{0,62}$` $ver)) }}
{{- include "gpu-injector.v.invalid" (list $v (printf "%s.%s" $sp $name) (include "gpu-injector.v.truncate" (list $ver 64)) "must be a version like 580.159.04: digits, letters, '.', '-' or '_', at most 63 characters") }}
{{- end }}
{{- end }}
{{- $runtime := get $s "runtimeInjection" | default "" }}
{{- if and (eq $runtime "") (not $mounts) }}
{{- include "gpu-injector.v.add" (list $v (printf "%s.mounts: Required value: at least one mount" $sp)) }}
{{- else if and (has $runtime (list "toolkit" "cdi")) (or $mounts $libs) }}
{{- include "gpu-injector.v.add" (list $v (printf "%s.mounts: Forbidden: a node whose runtime injects the driver publishes no mounts and no library paths" $sp)) }}
{{- else if and (eq $runtime "device-plugin") $mounts }}
{{- /* Its library paths say where the plugin's own mount puts the libraries. */}}
{{- include "gpu-injector.v.add" (list $v (printf "%s.mounts: Forbidden: a node whose device plugin injects the driver publishes no mounts" $sp)) }}
{{- end }}
{{- if gt (len $mounts) 128 }}
{{- include "gpu-injector.v.add" (list $v (printf "%s.mounts: Too many: %d: must have at most 128 items" $sp (len $mounts))) }}
{{- end }}
{{- $seen := dict }}
{{- range $i, $m := $mounts }}
{{- $fp := printf "%s.mounts[%d]" $sp $i }}
{{- $hp := get $m "hostPath" }}
{{- $cp := get $m "containerPath" }}
{{- $kind := get $m "kind" }}
{{- with include "gpu-injector.v.pathError" $hp }}
{{- include "gpu-injector.v.invalid" (list $v (printf "%s.hostPath" $fp) (include "gpu-injector.v.truncate" (list $hp 256)) .) }}
{{- else }}
{{- $kernel := list }}
{{- range splitList "/" $hp }}{{ if has . (list "proc" "sys" "dev") }}{{ $kernel = append $kernel . }}{{ end }}{{ end }}
{{- if $kernel }}
{{- include "gpu-injector.v.add" (list $v (printf "%s.hostPath: Forbidden: %q has a %q element: a view of the host's processes, devices or kernel (e.g. /proc/1/root is the host's /) is never a driver folder" $fp $hp (first $kernel))) }}
{{- else if not (include "gpu-injector.v.hostPathAllowed" (list $v $hp $kind $r)) }}
{{- include "gpu-injector.v.add" (list $v (printf "%s.hostPath: Forbidden: %q is not under the host path allowlist" $fp $hp)) }}
{{- end }}
{{- end }}
{{- with include "gpu-injector.v.pathError" $cp }}
{{- include "gpu-injector.v.invalid" (list $v (printf "%s.containerPath" $fp) (include "gpu-injector.v.truncate" (list $cp 256)) .) }}
{{- else }}
{{- if not (include "gpu-injector.v.underAny" (list $cp $r.roots (eq $kind "Directory"))) }}
{{- include "gpu-injector.v.add" (list $v (printf "%s.containerPath: Forbidden: %q is not under the container mount points %v" $fp $cp $r.roots)) }}
{{- end }}
{{- end }}
{{- if hasKey $seen $cp }}
{{- include "gpu-injector.v.add" (list $v (printf "%s.containerPath: Duplicate value: %q" $fp $cp)) }}
{{- end }}
{{- $_ := set $seen $cp true }}
{{- end }}
{{- range $i, $lp := $libs }}
{{- $fp := printf "%s.libraryPaths[%d]" $sp $i }}
{{- $err := include "gpu-injector.v.pathError" $lp }}
{{- if $err }}
{{- include "gpu-injector.v.invalid" (list $v $fp (include "gpu-injector.v.truncate" (list $lp 256)) $err) }}
{{- else if contains ":" $lp }}
{{- include "gpu-injector.v.invalid" (list $v $fp $lp "must not contain ':'") }}
{{- else if not (include "gpu-injector.v.underAny" (list $lp $r.roots true)) }}
{{- include "gpu-injector.v.add" (list $v (printf "%s: Forbidden: %q is not under the container mount points %v" $fp $lp $r.roots)) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
gpu-injector.v.hostPathAllowed: a driver file directly inside a filesOnly entry, or a
path one of whose folders (itself included) matches a whole-folder entry.
(list $v path kind rules).
*/}}
{{- define "gpu-injector.v.hostPathAllowed" -}}
{{- $v := index . 0 }}
{{- $p := index . 1 }}
{{- $kind := index . 2 }}
{{- $r := index . 3 }}
{{- $ok := false }}
{{- range $a := $r.allowlist }}
{{- if get $a "filesOnly" }}
{{- if and (eq $kind "File") (include "gpu-injector.v.match" (list $v (get $a "path") (dir $p))) }}
{{- range $pat := $r.patterns }}
{{- if include "gpu-injector.v.match" (list $v $pat (base $p)) }}{{ $ok = true }}{{ end }}
{{- end }}
{{- end }}
{{- else }}
{{- range $q := fromJsonArray (include "gpu-injector.v.ancestors" $p) }}
{{- if include "gpu-injector.v.match" (list $v (get $a "path") $q) }}{{ $ok = true }}{{ end }}
{{- end }}
{{- end }}
{{- end }}
{{- if $ok }}true{{ end }}
{{- end }}

{{/* gpu-injector.v.underAny: (list path roots allowSelf), layout's underAny. */}}
{{- define "gpu-injector.v.underAny" -}}
{{- $p := index . 0 }}
{{- range $root := index . 1 }}
{{- if or (and (eq $p $root) (index $ 2)) (hasPrefix (printf "%s/" $root) $p) }}true{{ end }}
{{- end }}
{{- end }}

{{/* gpu-injector.v.pathError: layout's checkAbsClean message, empty for a good path. */}}
{{- define "gpu-injector.v.pathError" -}}
{{- if eq . "" }}must not be empty
{{- else if not (hasPrefix "/" .) }}must be an absolute path
{{- else if or (contains "\x00" .) (contains "\n" .) }}must not contain NUL or newline
{{- else if and (ne . "/") (not (include "gpu-injector.v.absClean" .)) }}must be a clean path (no '..', '.', '//' or trailing '/')
{{- else if eq . "/" }}must not be the root folder
{{- end }}
{{- end }}

{{/*
gpu-injector.v.absClean: "true" when path.IsAbs(p) && path.Clean(p) == p: "/" or
slash-separated elements, none empty, "." or "..".
*/}}
{{- define "gpu-injector.v.absClean" -}}
{{- if or (eq . "/") (and (regexMatch `^(/[^/]+)+$` .) (not (regexMatch `(^|/)\.\.?(/|$)` .))) }}true{{ end }}
{{- end }}

{{/* gpu-injector.v.truncate: (list s n), layout's truncate. */}}
{{- define "gpu-injector.v.truncate" -}}
{{- $s := index . 0 }}
{{- if gt (len $s) (index . 1) }}{{ trunc (index . 1) $s }}...{{ else }}{{ $s }}{{ end }}
{{- end }}

{{/*
gpu-injector.v.glob: "true" when path.Match accepts the pattern, by path.Match's own
grammar: a class is non-empty, a range's ends are characters, '\' escapes one
character, and a class that starts with '^' is negated.
*/}}
{{- define "gpu-injector.v.glob" -}}
{{- $item := `(?:[^\\\]\-]|\\.)(?:-(?:[^\\\]\-]|\\.))?` }}
{{- $first := `(?:[^\\\]\-^]|\\.)(?:-(?:[^\\\]\-]|\\.))?` }}
{{- if regexMatch (printf `^(?s:[^\[\\]|\\.|\[\^(?:%s)+\]|\[%s(?:%s)*\])*$` $item $first $item) . }}true{{ end }}
{{- end }}

{{/*
gpu-injector.v.match is path.Match(pattern, name): (list $v pattern name), "true" on a
match. The pattern becomes a regular expression, kept in $v.re: '*' and '?' stand for
characters other than '/', a class for any one character, as in path.Match.
*/}}
{{- define "gpu-injector.v.match" -}}
{{- $v := index . 0 }}
{{- $pattern := index . 1 }}
{{- if not (hasKey $v.re $pattern) }}
{{- $re := "" }}
{{- if include "gpu-injector.v.glob" $pattern }}
{{- range $tok := regexFindAll `(?s)\\.|\[\^?(?:\\.|[^\\\]])+\]|.` $pattern -1 }}
{{- if eq $tok "*" }}{{ $re = print $re `[^/]*` }}
{{- else if eq $tok "?" }}{{ $re = print $re `[^/]` }}
{{- else if and (hasPrefix "[" $tok) (gt (len $tok) 1) }}
{{- $class := "[" }}
{{- $inner := trimSuffix "]" (trimPrefix "[" $tok) }}
{{- if hasPrefix "^" $inner }}{{ $class = "[^" }}{{ $inner = trimPrefix "^" $inner }}{{ end }}
{{- range $ch := regexFindAll `(?s)\\.|.` $inner -1 }}
{{- if eq $ch "-" }}{{ $class = print $class "-" }}
{{- else }}
{{- $lit := $ch }}
{{- if and (hasPrefix `\` $ch) (gt (len $ch) 1) }}{{ $lit = substr 1 (len $ch) $ch }}{{ end }}
{{- if contains $lit `\]-^[` }}{{ $class = print $class `\` $lit }}{{ else }}{{ $class = print $class $lit }}{{ end }}
{{- end }}
{{- end }}
{{- $re = print $re $class "]" }}
{{- else if and (hasPrefix `\` $tok) (gt (len $tok) 1) }}{{ $re = print $re (regexQuoteMeta (substr 1 (len $tok) $tok)) }}
{{- else }}{{ $re = print $re (regexQuoteMeta $tok) }}
{{- end }}
{{- end }}
{{- $re = printf "^(?:%s)$" $re }}
{{- end }}
{{- $_ := set $v.re $pattern $re }}
{{- end }}
{{- $re := get $v.re $pattern }}
{{- if and $re (regexMatch $re (index . 2)) }}true{{ end }}
{{- end }}

{{/* Kubernetes name formats, with the messages of k8s.io/apimachinery's validation. */}}

{{/* gpu-injector.v.qualifiedName: IsQualifiedName's messages, joined by "; ". */}}
{{- define "gpu-injector.v.qualifiedName" -}}
{{- $keyMsg := `must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')` }}
{{- $parts := splitList "/" . }}
{{- $msgs := list }}
{{- if gt (len $parts) 2 }}
{{- $msgs = append $msgs (printf "a valid label key %s with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')" $keyMsg) }}
{{- else }}
{{- $name := last $parts }}
{{- if eq (len $parts) 2 }}
{{- $prefix := first $parts }}
{{- if eq $prefix "" }}
{{- $msgs = append $msgs "prefix part must be non-empty" }}
{{- else }}
{{- range splitList "; " (include "gpu-injector.v.dnsSubdomain" (list $prefix "bytes")) }}
{{- if . }}{{ $msgs = append $msgs (printf "prefix part %s" .) }}{{ end }}
{{- end }}
{{- end }}
{{- end }}
{{- if eq $name "" }}
{{- $msgs = append $msgs "name part must be non-empty" }}
{{- else if gt (len $name) 63 }}
{{- $msgs = append $msgs "name part must be no more than 63 bytes" }}
{{- end }}
{{- if not (regexMatch `^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$` $name) }}
{{- $msgs = append $msgs (printf "name part %s" $keyMsg) }}
{{- end }}
{{- end }}
{{- join "; " $msgs }}
{{- end }}

{{/*
gpu-injector.v.dnsSubdomain: IsDNS1123Subdomain's messages, (list value unit): the
validation package says "characters", the content package (a label key's prefix) "bytes".
*/}}
{{- define "gpu-injector.v.dnsSubdomain" -}}
{{- $s := index . 0 }}
{{- $msgs := list }}
{{- if gt (len $s) 253 }}
{{- $msgs = append $msgs (printf "must be no more than 253 %s" (index . 1)) }}
{{- end }}
{{- if not (regexMatch `^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$` $s) }}
{{- $msgs = append $msgs `a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')` }}
{{- end }}
{{- join "; " $msgs }}
{{- end }}

{{/* gpu-injector.v.dnsLabel: IsDNS1123Label's messages. */}}
{{- define "gpu-injector.v.dnsLabel" -}}
{{- $msgs := list }}
{{- if gt (len .) 63 }}
{{- $msgs = append $msgs "must be no more than 63 characters" }}
{{- end }}
{{- if not (regexMatch `^[a-z0-9]([-a-z0-9]*[a-z0-9])?$` .) }}
{{- if regexMatch `^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$` . }}
{{- $msgs = append $msgs "must not contain dots" }}
{{- else }}
{{- $msgs = append $msgs `a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')` }}
{{- end }}
{{- end }}
{{- join "; " $msgs }}
{{- end }}

{{/* gpu-injector.v.labelValue: IsValidLabelValue's messages. */}}
{{- define "gpu-injector.v.labelValue" -}}
{{- $msgs := list }}
{{- if gt (len .) 63 }}
{{- $msgs = append $msgs "must be no more than 63 bytes" }}
{{- end }}
{{- if not (regexMatch `^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$` .) }}
{{- $msgs = append $msgs `a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')` }}
{{- end }}
{{- join "; " $msgs }}
{{- end }}

{{/*
gpu-injector.validateRuntimeInjection: the chart's own rules for the NRI plugin, which the
binary cannot check because they join values of two components.
*/}}
{{- define "gpu-injector.validateRuntimeInjection" -}}
{{- if and .Values.runtimeInjection.enabled (not .Values.nodeprobe.enabled) }}
{{- fail "runtimeInjection.enabled (on by default) needs nodeprobe.enabled: the NRI plugin runs in the probe's pod and injects the plan the probe finds; with nodeprobe.enabled=false, set runtimeInjection.enabled=false too" }}
{{- end }}
{{- if and (eq (.Values.config.driverDelivery | default "PreferRuntime") "Runtime") (not .Values.runtimeInjection.enabled) }}
{{- fail "config.driverDelivery Runtime needs runtimeInjection.enabled: without the NRI plugin no node injects at the runtime, and every GPU pod would get the noLayout action" }}
{{- end }}
{{- end }}
