{{/*
The MutatingAdmissionPolicy of runtime delivery (admission.policy): the CEL that decides
which pods the API server admits alone and what it writes on them. Each piece mirrors a
step of the webhook's decision (webhook/inject: newRequest, runtimeChoice, injectRuntime)
for the pods where that step needs nothing but the pod; every other pod is the webhook's.
charts/policy_test.go runs the golden cases through this CEL and through Mutate.
*/}}

{{/*
gpu-injector.policy.gpuName: CEL true when the resource name in the variable named by
.var is a configured GPU resource that is not a legacy one: config.resources.names,
exact names and patterns of a trailing * only (path.Match: the * does not cross a /).
*/}}
{{- define "gpu-injector.policy.gpuName" -}}
{{- $v := .var }}
{{- $terms := list }}
{{- range .root.Values.config.resources.names }}
{{- if not (has . $.root.Values.config.resources.legacy) }}
{{- $prefix := trimSuffix "*" . }}
{{- if eq $prefix . }}
{{- $terms = append $terms (printf "%s == %s" $v (squote .)) }}
{{- else }}
{{- $terms = append $terms (printf "(%s.startsWith(%s) && !%s.substring(%d).contains('/'))" $v (squote $prefix) $v (len $prefix)) }}
{{- end }}
{{- end }}
{{- end }}
{{- if $terms }}({{ join " || " $terms }}){{ else }}false{{ end }}
{{- end }}

{{/*
gpu-injector.policy.unsupported: why the configuration rules the policy out; empty when
it allows it. The webhook's answer for the pods the policy takes is a function of the pod
alone with driverDelivery Runtime, and with PreferRuntime while no known GPU node needs
hostPath volumes, which the webhook's elected replica says through the policy's parameter
(gpu-injector.policy.switched); it is not without the NRI plugin, with image-aware
admission, or with GPU resource names the CEL above cannot read as path.Match does. The limits must hold for every pod the policy takes: its patch is 2 operations a
container and 3 more, under 700 bytes a container, and the marker names at most 64
bytes a container.
*/}}
{{- define "gpu-injector.policy.unsupported" -}}
{{- $c := .Values.config }}
{{- $l := $c.limits }}
{{- if not (has $c.driverDelivery (list "Runtime" "PreferRuntime")) }}config.driverDelivery is {{ $c.driverDelivery }}, not Runtime or PreferRuntime
{{- else if not .Values.runtimeInjection.enabled }}runtimeInjection.enabled is false
{{- else if eq ((($c.images) | default dict).mode | default "Off") "On" }}config.images.mode is On
{{- else if not (has ($c.containers | default "GPU") (list "GPU" "All")) }}config.containers is {{ $c.containers }}
{{- else }}
{{- range $c.resources.names }}
{{- if regexMatch "[*?\\[\\\\]" (trimSuffix "*" .) }}config.resources.names has {{ . }}, a pattern other than a trailing *{{ end }}
{{- end }}
{{- $max := int $l.maxGPUContainers }}
{{- if or (gt (add (mul 2 $max) 3) (int $l.maxPatchOperations)) (gt (add (mul 700 $max) 512) (int $l.maxPatchBytes)) (gt (mul 64 $max) 16384) }}config.limits: maxGPUContainers {{ $max }} is too many for maxPatchOperations, maxPatchBytes or the marker's 16 KiB
{{- end }}
{{- end }}
{{- end }}

{{/*
gpu-injector.policy.served: "true" where the API server serves admissionregistration.k8s.io/v1
MutatingAdmissionPolicy. helm install, upgrade and template --validate list every kind the
cluster serves (group/version/Kind), MutatingWebhookConfiguration among them: the kind's
presence decides there, whatever the version says (a 1.36 or later API server may leave it
out: --runtime-config, the MutatingAdmissionPolicy feature gate, --emulated-version). helm
template without a cluster lists group/versions only (and what --api-versions adds): the
version decides there, as 1.36 and later serve the kind by default.
*/}}
{{- define "gpu-injector.policy.served" -}}
{{- $apis := .Capabilities.APIVersions }}
{{- if $apis.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" -}}
true
{{- else if and (not ($apis.Has "admissionregistration.k8s.io/v1/MutatingWebhookConfiguration")) (semverCompare ">=1.36-0" .Capabilities.KubeVersion.Version) -}}
true
{{- end }}
{{- end }}

{{/*
gpu-injector.policy.enabled: "true" where the chart renders the policy. auto: where the
API server serves it (gpu-injector.policy.served) and the configuration allows it.
*/}}
{{- define "gpu-injector.policy.enabled" -}}
{{- $mode := (.Values.admission | default dict).policy | default "auto" }}
{{- $why := include "gpu-injector.policy.unsupported" . }}
{{- if eq $mode "on" }}
{{- if $why }}{{ fail (printf "admission.policy=on, but %s: the webhook's answer is not a function of the pod alone; set admission.policy=auto or off" $why) }}{{ end -}}
true
{{- else if and (eq $mode "auto") (not $why) (include "gpu-injector.policy.served" .) -}}
true
{{- end }}
{{- end }}

{{/*
gpu-injector.policy.switched: "true" where the policy runs only while the webhook's
elected replica opens its binding (gpu-injector.policy.name): under PreferRuntime, whose
answer depends on the nodes.
*/}}
{{- define "gpu-injector.policy.switched" -}}
{{- if and (include "gpu-injector.policy.enabled" .) (eq .Values.config.driverDelivery "PreferRuntime") }}true{{ end }}
{{- end }}

{{/* The policy's name, and its one binding's. */}}
{{- define "gpu-injector.policy.name" -}}
{{- printf "%s-runtime" (include "gpu-injector.fullname" .) }}
{{- end }}

{{/* The pod's containers, init containers first, as the webhook names them. */}}
{{- define "gpu-injector.policy.containers" -}}
(object.spec.?initContainers.orValue([]) + object.spec.containers)
{{- end }}

{{/*
CEL true when container c wants a GPU: a GPU resource of non-zero quantity. The API server
hands CEL a quantity in its canonical form, "0" for every zero.
*/}}
{{- define "gpu-injector.policy.wantsGPU" -}}
{{- $gpu := include "gpu-injector.policy.gpuName" (dict "root" . "var" "k") -}}
(c.?resources.?limits.orValue({}).exists(k, {{ $gpu }} && string(c.resources.limits[k]) != '0') || c.?resources.?requests.orValue({}).exists(k, {{ $gpu }} && string(c.resources.requests[k]) != '0'))
{{- end }}

{{/* The containers that get the driver (config.containers), of the containers bound to cs. */}}
{{- define "gpu-injector.policy.targets" -}}
{{- if eq (.Values.config.containers | default "GPU") "All" -}}
(cs.exists(c, {{ include "gpu-injector.policy.wantsGPU" . }}) ? cs : [])
{{- else -}}
cs.filter(c, {{ include "gpu-injector.policy.wantsGPU" . }})
{{- end }}
{{- end }}

{{/*
gpu-injector.policy.cheap: the first terms of the policy's condition, each cheap, and
failing for most pods the policy does not take, the most common first: a pod without a GPU.
The policy takes only a pod without the opt-out annotation or with "true": the webhook skips
"false" and warns of any other value, a warning the policy cannot give.
*/}}
{{- define "gpu-injector.policy.cheap" -}}
{{- $cs := include "gpu-injector.policy.containers" . }}
- name: wants-a-gpu
  expression: {{ printf "%s.exists(c, %s)" $cs (include "gpu-injector.policy.wantsGPU" .) | toJson }}
- name: not-opted-out
  expression: {{ `object.metadata.?annotations[?'gpu-injector.io/inject'].orValue('true').matches('^[ -~]*$') && object.metadata.?annotations[?'gpu-injector.io/inject'].orValue('true').lowerAscii() == 'true'` | toJson }}
- name: no-host-path
  expression: {{ `object.spec.?volumes.orValue([]).all(v, !has(v.hostPath))` | toJson }}
- name: no-claims
  expression: {{ `object.spec.?resourceClaims.orValue([]).size() == 0` | toJson }}
- name: no-cuda-requirement
  expression: {{ `!('gpu-injector.io/cuda-requirement' in object.metadata.?annotations.orValue({}))` | toJson }}
- name: no-images-unread-record
  expression: {{ `!('gpu-injector.io/images-unread' in object.metadata.?annotations.orValue({})) && !('gpu-injector.io/images-unread' in object.metadata.?labels.orValue({}))` | toJson }}
{{- end }}

{{/*
gpu-injector.policy.shape: CEL true when the pod's resources and target containers are
ones the policy takes, with .extra (CEL of the targets bound to t, their names to n)
and-ed on; the containers are bound to cs. With the cheap conditions: a pod they hold
for needs nothing the webhook knows beyond the pod: no resource fix (a legacy name, a GPU
request without a limit), no DRA or other extended resource whose meaning a DeviceClass
gives, no hostPath volume (a hand-written driver mount is one of a known driver folder or
a node's layout), target names the NRI plugin's marker can name (distinct DNS labels),
within the limits.
*/}}
{{- define "gpu-injector.policy.shape" -}}
{{- $root := .root }}
{{- $gpu := include "gpu-injector.policy.gpuName" (dict "root" $root "var" "k") }}
{{- $known := printf "(k in ['cpu', 'memory', 'ephemeral-storage'] || k.startsWith('hugepages-') || %s)" $gpu }}
{{- $resources := printf "cs.all(c, c.?resources.?limits.orValue({}).all(k, %s) && c.?resources.?requests.orValue({}).all(k, %s && (!%s || k in c.?resources.?limits.orValue({}))))" $known $known $gpu }}
{{- $names := printf "t.size() <= %d && n.all(x, x.size() <= 63 && x.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')) && n.distinct().size() == n.size()" (int $root.Values.config.limits.maxGPUContainers) }}
{{- printf "[%s].all(cs, %s && [%s].all(t, [t.map(c, c.name)].all(n, %s%s)))" (include "gpu-injector.policy.containers" $root) $resources (include "gpu-injector.policy.targets" $root) $names (.extra | default "") }}
{{- end }}

{{/*
gpu-injector.policy.condition: the pods the policy takes: the cheap terms, none of the
annotations only gpu-injector writes (the webhook checks what they say), and resources and
target names the policy can take.
*/}}
{{- define "gpu-injector.policy.condition" -}}
{{- $terms := list }}
{{- range include "gpu-injector.policy.cheap" . | fromYamlArray }}{{ $terms = append $terms (printf "(%s)" .expression) }}{{ end }}
{{- $terms = append $terms (printf "(%s)" (include "gpu-injector.policy.unmarked" .)) }}
{{- $terms = append $terms (printf "(%s)" (include "gpu-injector.policy.shape" (dict "root" .))) }}
{{- join " && " $terms }}
{{- end }}

{{- define "gpu-injector.policy.unmarked" -}}
!object.metadata.?annotations.orValue({}).exists(k, k == 'gpu-injector.io/runtime-inject' || k == 'gpu-injector.io/injected' || k.startsWith('required-plugins.noderesource.dev'))
{{- end }}

{{/* gpu-injector's injection record of the target names in the CEL list .names. */}}
{{- define "gpu-injector.policy.record" -}}
'{"driverVersion":"","containers":[' + {{ .names }}.map(n, '"' + n + '"').join(',') + '],"runtime":"nri"}'
{{- end }}

{{/*
NRI's required-plugins key for the container whose name is in the CEL variable named by
the argument, after the prefix's "/": container-scoped, or pod-scoped for a name too long
for a key (webhook/inject: requiredPlugins).
*/}}
{{- define "gpu-injector.policy.pluginsKey" -}}
({{ . }}.size() > 53 ? 'pod' : 'container.' + {{ . }})
{{- end }}
