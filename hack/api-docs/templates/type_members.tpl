{{- define "type_members" -}}
{{- $field := . -}}
{{- if eq $field.Name "metadata" -}}
Refer to Kubernetes API documentation for fields of `metadata`.
{{- else -}}
{{ template "flowing_doc" $field.Doc }}
{{- end -}}
{{- end -}}

{{- /*
  A doc comment as one table cell: its wrapped lines joined with spaces, a
  blank line kept as a break.
*/ -}}
{{- define "flowing_doc" -}}
{{ markdownRenderFieldDoc (. | trim | replace "\n\n" "\u2029" | replace "\n" " " | replace "\u2029" "\n\n") }}
{{- end -}}
