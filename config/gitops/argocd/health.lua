-- Argo CD health of a greyrelease.io/v1 GreyRelease, from its status alone.
-- Installed as resource.customizations.health.greyrelease.io_GreyRelease in argocd-cm (argocd-cm.yaml
-- beside this file carries the same text). Argo CD runs it with Lua's base and table libraries only (no
-- string library), in Lua 5.1 (gopher-lua): strings are only compared and joined here.
--
--   Progressing  being deleted (the finalizer puts the Deployment back), no status yet, a generation
--                the controller has not seen, Reconciling=True, Initializing, Waiting (a window, a
--                freeze, a release it comes after), Queued, Progressing, Promoting
--   Suspended    Paused, or a batch waiting for greyrelease.io/promote: a person has to act
--   Degraded     Stalled=True, RollingBack, Aborted, Failed, InvalidSpec
--   Healthy      Ready=True, Succeeded, Idle (follow mode, nothing held)
--   Unknown      a phase this script does not know
-- Stalled, Reconciling and Ready are read when the status has them (follow mode), as kstatus reads them.

local function condition(status, kind)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function either(text, otherwise)
  if text ~= nil and text ~= "" then
    return text
  end
  return otherwise
end

local function said(phase, message)
  if phase == "" then
    return message
  end
  if message ~= "" then
    return phase .. ": " .. message
  end
  return phase
end

local hs = {}
local status = obj.status

if obj.metadata ~= nil and obj.metadata.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  hs.message = "Being deleted: the Deployment is put back as it was before the release"
  return hs
end

if status == nil or ((status.phase == nil or status.phase == "") and status.conditions == nil) then
  hs.status = "Progressing"
  hs.message = "Waiting for the controller"
  return hs
end

local generation = obj.metadata.generation
local observed = status.observedGeneration or 0
if generation ~= nil and observed < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the controller to see generation " .. tostring(generation)
  return hs
end

local phase = status.phase or ""
local message = status.message or ""

local stalled = condition(status, "Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = said(phase, either(stalled.message, message))
  return hs
end

if phase == "RollingBack" or phase == "Aborted" or phase == "Failed" or phase == "InvalidSpec" then
  hs.status = "Degraded"
  hs.message = said(phase, message)
  return hs
end

if phase == "Paused" or (phase == "Progressing" and status.batchState == "WaitingForApproval") then
  hs.status = "Suspended"
  hs.message = said(phase, message)
  return hs
end

local reconciling = condition(status, "Reconciling")
if reconciling ~= nil and reconciling.status == "True" then
  hs.status = "Progressing"
  hs.message = said(phase, either(reconciling.message, message))
  return hs
end

local ready = condition(status, "Ready")
if ready ~= nil then
  if ready.status == "True" then
    hs.status = "Healthy"
  else
    hs.status = "Progressing"
  end
  hs.message = said(phase, either(ready.message, message))
  return hs
end

if phase == "Succeeded" or phase == "Idle" then
  hs.status = "Healthy"
elseif phase == "Initializing" or phase == "Waiting" or phase == "Queued" or phase == "Progressing"
    or phase == "Promoting" then
  hs.status = "Progressing"
else
  hs.status = "Unknown"
  message = "unknown phase '" .. phase .. "'"
end
hs.message = said(phase, message)
return hs
