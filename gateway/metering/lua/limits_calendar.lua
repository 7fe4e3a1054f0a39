-- Budget windows from server time (part of the limiter scripts' prelude, limits_common.lua).
-- Days since 1970-01-01 <-> proleptic Gregorian date (H. Hinnant's civil algorithms).
local function civil_from_days(z)
  z = z + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then
    y = y + 1
  end
  return y, m, d
end

local function days_from_civil(y, m, d)
  if m <= 2 then
    y = y - 1
  end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = m > 2 and m - 3 or m + 9
  local doy = math.floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end

-- The UTC budget window holding `now` and when it ends (ms; -1 = never). Weeks are ISO weeks
-- (Monday to Sunday), named by their ISO year and number: "2025-W23".
local function budget_window(period, now)
  if period == 'total' then
    return 'total', -1
  end
  local day = math.floor(now / DAY_MS)
  if period == 'week' then
    local monday = day - (day + 3) % 7 -- 1970-01-01 was a Thursday
    local year = civil_from_days(monday + 3) -- the ISO year is the year of its Thursday
    local week = math.floor((monday + 3 - days_from_civil(year, 1, 1)) / 7) + 1
    return string.format('%04d-W%02d', year, week), (monday + 7) * DAY_MS
  end
  local y, m, d = civil_from_days(day)
  if period == 'day' then
    return string.format('%04d-%02d-%02d', y, m, d), (day + 1) * DAY_MS
  end
  if m == 12 then
    return string.format('%04d-%02d', y, m), days_from_civil(y + 1, 1, 1) * DAY_MS
  end
  return string.format('%04d-%02d', y, m), days_from_civil(y, m + 1, 1) * DAY_MS
end
