-- Argo CD health check for migration.restow.dev/StorageMigration.
--
-- Install it in argocd-cm under the key
--   resource.customizations.health.migration.restow.dev_StorageMigration
-- (docs/gitops.md shows how). It reads the conditions restow writes:
--   Healthy      Ready is True for the current generation: every object is
--                stored at the storage version and storedVersions is pruned
--                (reason BaselineUnproven: a built-in resource's baseline
--                restow could not prove; nothing is under way, the message
--                says what would prove it).
--   Degraded     Stalled is True: the migration cannot finish without help;
--                the message says why (objects that fail, a missing resource).
--   Progressing  anything else: a pass is running, restow waits for the API
--                server to switch storage, retries a transient error, or has
--                not seen the latest spec yet.
local hs = { status = "Progressing", message = "Waiting for restow to observe the StorageMigration" }

if obj.status == nil or obj.status.conditions == nil then
  return hs
end
if obj.status.observedGeneration == nil or obj.metadata.generation == nil
    or obj.status.observedGeneration < obj.metadata.generation then
  return hs
end

local function condition(conditionType)
  for _, c in ipairs(obj.status.conditions) do
    if c.type == conditionType then
      return c
    end
  end
  return nil
end

local function describe(c)
  if c.message ~= nil and c.message ~= "" then
    return c.reason .. ": " .. c.message
  end
  return c.reason
end

local stalled = condition("Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(stalled)
  return hs
end

local ready = condition("Ready")
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = describe(ready)
  return hs
end

local reconciling = condition("Reconciling")
if reconciling ~= nil and reconciling.status == "True" then
  hs.message = describe(reconciling)
elseif ready ~= nil then
  hs.message = describe(ready)
end
return hs
